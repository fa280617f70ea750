//! The vhost-user protocol, backend side (`VhostUserBackendReqHandlerMut`). The `vhost`
//! crate reads and validates each message (header, size, fds); this handler applies it to
//! the shared [`VhostState`]. Requests qswitch does not support are refused with an error, which
//! the frontend sees as a failed request.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use qswitch_sys::guestmap;
use vhost::vhost_user::message::*;
use vhost::vhost_user::{Backend, Error, GpuBackend, Result, VhostUserBackendReqHandlerMut};
use vhost::VhostUserMemoryRegionBase;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestAddressSpace, GuestRegionMmap};

use qswitch_sys::dirty_log::{DirtyLog, LOG_PAGE};
use qswitch_sys::guestmap::MapOwner;

use super::{
    protocol_features, GuestMem, VhostState, Vring, FEATURES, F_PROTOCOL_FEATURES, MAX_MEM_SLOTS,
    MAX_QUEUE_SIZE,
};

type Region = Arc<GuestRegionMmap<MapOwner>>;

/// Host virtual address → guest physical address, from SET_MEM_TABLE.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    vmm_addr: u64,
    size: u64,
    gpa: u64,
}

/// The protocol state of one connection.
pub struct Handler {
    dev: Arc<VhostState>,
    owned: bool,
    acked_features: u64,
    acked_protocol: u64,
    /// The memory slots (SET_MEM_TABLE, ADD_MEM_REG), in the order they came.
    regions: Vec<(Mapping, Region)>,
    /// SET_VRING_ENABLE requests that arrived before SET_FEATURES (see `defer_enable`).
    early_enables: Vec<(u32, bool)>,
}

fn unsupported(what: &'static str) -> Error {
    Error::InvalidOperation(what)
}

impl Handler {
    pub(crate) fn new(dev: Arc<VhostState>) -> Handler {
        Handler {
            dev,
            owned: false,
            acked_features: 0,
            acked_protocol: 0,
            regions: Vec::new(),
            early_enables: Vec::new(),
        }
    }

    /// Records a SET_VRING_ENABLE that came before SET_FEATURES (QEMU 7.2 sends one), to be
    /// applied when the features arrive.
    pub(crate) fn defer_enable(&mut self, index: u32, enable: bool) {
        if (index as usize) < self.dev.vrings.len() {
            self.early_enables.retain(|(i, _)| *i != index);
            self.early_enables.push((index, enable));
        }
    }

    /// VHOST_USER_SEND_RARP (after a migration, for a guest without GUEST_ANNOUNCE):
    /// hands the switch a RARP from `mac` as if the guest had sent it, so that the MAC
    /// moves to this port in the forwarding table at once.
    pub(crate) fn send_rarp(&self, mac: [u8; 6]) {
        if self.acked_protocol & VhostUserProtocolFeatures::RARP.bits() == 0 {
            tracing::warn!(port = %self.dev.name, "SEND_RARP without the RARP protocol feature; ignored");
            return;
        }
        tracing::info!(port = %self.dev.name, mac = ?mac, "announcing the guest (SEND_RARP)");
        self.dev.inject_rarp(mac);
    }

    /// Whether the frontend completed its handshake (SET_OWNER).
    pub(crate) fn handshake_done(&self) -> bool {
        self.owned
    }

    /// Refuses a kick or call fd that is not an eventfd (a pipe, socket or file could block
    /// a worker, or stay readable for ever and make it spin).
    fn check_eventfd(&self, fd: &Option<File>, what: &str) -> Result<()> {
        match fd {
            Some(f) if !qswitch_sys::eventfd::is_eventfd(f) => {
                tracing::warn!(port = %self.dev.name, "{what} fd is not an eventfd; refused");
                Err(Error::InvalidParam)
            }
            _ => Ok(()),
        }
    }

    fn vring(&self, index: u32) -> Result<&parking_lot::Mutex<Vring>> {
        self.dev
            .vrings
            .get(index as usize)
            .ok_or(Error::InvalidParam)
    }

    fn va_to_gpa(&self, va: u64) -> Result<GuestAddress> {
        self.regions
            .iter()
            .map(|(m, _)| m)
            .find(|m| va >= m.vmm_addr && va - m.vmm_addr < m.size)
            .map(|m| GuestAddress(m.gpa + (va - m.vmm_addr)))
            .ok_or(Error::InvalidParam)
    }

    /// Maps one memory region from the frontend (SET_MEM_TABLE, ADD_MEM_REG).
    fn map_region(&self, region: &VhostUserMemoryRegion, file: File) -> Result<(Mapping, Region)> {
        // Memory the frontend could shrink under the mapping would SIGBUS the first
        // worker to touch it: seal it where the kernel allows (before the size check,
        // so that it cannot shrink in between); otherwise the SIGBUS handler of
        // `guestmap` covers it.
        let seal = guestmap::seal_against_shrink(&file).map_err(|e| {
            tracing::warn!(port = %self.dev.name, error = %e,
                "sealable guest memory refused F_SEAL_SHRINK; refused");
            Error::ReqHandlerError(e)
        })?;
        // A mapping past the end of the file would SIGBUS the first worker that touches
        // it: refuse regions their file cannot back.
        let file_len = file.metadata().map_err(Error::ReqHandlerError)?.len();
        // Copies: the message struct is packed.
        let (offset, size) = (region.mmap_offset, region.memory_size);
        if offset.checked_add(size).is_none_or(|end| end > file_len) || size == 0 {
            tracing::warn!(port = %self.dev.name, file_len, offset, size,
                "memory region larger than its file; refused");
            return Err(Error::InvalidParam);
        }
        let gpa = region.guest_phys_addr;
        if gpa.checked_add(size).is_none() {
            return Err(Error::InvalidParam);
        }
        let len = usize::try_from(size).map_err(|_| Error::InvalidParam)?;
        let mmap = guestmap::map(&file, offset, len).map_err(Error::ReqHandlerError)?;
        tracing::debug!(port = %self.dev.name, size, sealed = ?seal, "memory region mapped");
        let r = GuestRegionMmap::new(mmap, GuestAddress(gpa)).ok_or(Error::InvalidParam)?;
        let m = Mapping {
            vmm_addr: region.user_addr,
            size,
            gpa,
        };
        Ok((m, Arc::new(r)))
    }

    /// Publishes `regions` as the guest memory the data path sees.
    fn publish_regions(&mut self, regions: Vec<(Mapping, Region)>) -> Result<()> {
        let mem = GuestMem::from_arc_regions(regions.iter().map(|(_, r)| r.clone()).collect())
            .map_err(|e| {
                tracing::warn!(port = %self.dev.name, error = %e, "memory regions refused");
                Error::InvalidParam
            })?;
        self.dev
            .mem
            .lock()
            .map_err(|_| Error::BackendInternalError)?
            .replace(mem);
        self.regions = regions;
        Ok(())
    }

    /// The end of guest-physical memory (the highest region end).
    fn mem_end(&self) -> u64 {
        self.regions
            .iter()
            .map(|(m, _)| m.gpa + m.size)
            .max()
            .unwrap_or(0)
    }

    /// Starts a ring once it has an address and a kick fd.
    fn maybe_start(&self, index: u32, v: &mut Vring) {
        if v.kick.is_some() && v.addr_set && !v.started {
            v.started = true;
            v.broken = false;
            // The guest set the ring up with notifications on; the first burst on it turns
            // them off (see `rings::rx_burst` and `rings::tx_burst`).
            v.notify = true;
            v.queue.set_ready(true);
            tracing::debug!(port = %self.dev.name, vring = index, size = v.queue.size(), "vring started");
            // A worker whose queues were all dormant sleeps without a timeout, and a guest
            // whose notifications were left off by an earlier connection never kicks.
            self.dev.ring_start.call();
        }
        self.dev.note_ring(index as usize, v);
    }
}

impl VhostUserBackendReqHandlerMut for Handler {
    fn set_owner(&mut self) -> Result<()> {
        if self.owned {
            return Err(Error::InvalidOperation("already owned"));
        }
        self.owned = true;
        Ok(())
    }

    fn reset_owner(&mut self) -> Result<()> {
        self.owned = false;
        self.dev.disconnect();
        self.dev.connected.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn reset_device(&mut self) -> Result<()> {
        self.reset_owner()
    }

    fn get_features(&mut self) -> Result<u64> {
        Ok(FEATURES)
    }

    fn set_features(&mut self, features: u64) -> Result<()> {
        if features & !FEATURES != 0 {
            return Err(Error::InvalidParam);
        }
        self.acked_features = features;
        self.dev.features.store(features, Ordering::Relaxed);
        let event_idx = features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        for v in self.dev.vrings.iter() {
            let mut v = v.lock();
            v.queue.set_event_idx(event_idx);
            // Without PROTOCOL_FEATURES there is no SET_VRING_ENABLE: rings start enabled.
            if features & F_PROTOCOL_FEATURES == 0 {
                v.enabled = true;
            }
        }
        if features & F_PROTOCOL_FEATURES != 0 {
            for (index, enable) in self.early_enables.drain(..) {
                self.dev.vrings[index as usize].lock().enabled = enable;
            }
        }
        for (i, v) in self.dev.vrings.iter().enumerate() {
            self.dev.note_ring(i, &v.lock());
        }
        self.dev.update_logging();
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> Result<Option<Vec<VhostUserMemoryRegionBase>>> {
        // The whole table first: a cap on the address space one port may take.
        let total = ctx
            .iter()
            .try_fold(0u64, |t, r| t.checked_add(r.memory_size));
        if total.is_none_or(|t| t > self.dev.max_guest_memory) {
            tracing::warn!(port = %self.dev.name, total = ?total, cap = self.dev.max_guest_memory,
                "guest memory larger than the per-port cap; refused");
            return Err(Error::InvalidParam);
        }
        if ctx.len() > MAX_MEM_SLOTS {
            tracing::warn!(port = %self.dev.name, regions = ctx.len(), max = MAX_MEM_SLOTS,
                "more memory regions than slots; refused");
            return Err(Error::InvalidParam);
        }
        let mut regions = Vec::with_capacity(ctx.len());
        for (region, file) in ctx.iter().zip(files) {
            regions.push(self.map_region(region, file)?);
        }
        self.publish_regions(regions)?;
        tracing::debug!(port = %self.dev.name, regions = ctx.len(), "memory table set");
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> Result<()> {
        if num == 0 || num > u32::from(MAX_QUEUE_SIZE) || !num.is_power_of_two() {
            return Err(Error::InvalidParam);
        }
        self.vring(index)?.lock().queue.set_size(num as u16);
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        log: u64,
    ) -> Result<()> {
        let desc = self.va_to_gpa(descriptor)?;
        let avail = self.va_to_gpa(available)?;
        let used = self.va_to_gpa(used)?;
        // Used-ring writes are logged by the guest-physical address of the used ring,
        // which is what QEMU passes as `log_guest_addr`; a frontend asking for another
        // address is refused rather than given a log it would misread.
        if flags.contains(VhostUserVringAddrFlags::VHOST_VRING_F_LOG) && log != used.0 {
            tracing::warn!(port = %self.dev.name, vring = index, log, used = used.0,
                "used-ring log address differs from the used ring; refused");
            return Err(Error::InvalidParam);
        }
        let mem = self.dev.mem.memory();
        let mut v = self.vring(index)?.lock();
        let q = &mut v.queue;
        q.try_set_desc_table_address(desc)
            .map_err(|_| Error::InvalidParam)?;
        q.try_set_avail_ring_address(avail)
            .map_err(|_| Error::InvalidParam)?;
        q.try_set_used_ring_address(used)
            .map_err(|_| Error::InvalidParam)?;
        // After a guest driver restart the used index in memory is the truth.
        if let Ok(idx) = q.used_idx(&*mem, std::sync::atomic::Ordering::Relaxed) {
            q.set_next_used(idx.0);
            v.used_signalled = idx.0;
        }
        v.used_pending = 0;
        v.avail_cached = v.queue.next_avail();
        v.addr_set = true;
        self.maybe_start(index, &mut v);
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> Result<()> {
        let mut v = self.vring(index)?.lock();
        v.queue.set_next_avail(base as u16);
        v.avail_cached = base as u16;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> Result<VhostUserVringState> {
        let mut v = self.vring(index)?.lock();
        v.started = false;
        v.queue.set_ready(false);
        let next_avail = v.queue.next_avail();
        if let Some(k) = v.kick.take() {
            self.dev.forget_kick(index as usize, k.as_raw_fd());
        }
        v.call = None;
        self.dev.note_ring(index as usize, &v);
        Ok(VhostUserVringState::new(index, u32::from(next_avail)))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        let i = u32::from(index);
        self.check_eventfd(&fd, "kick")?;
        let mut v = self.vring(i)?.lock();
        if let Some(old) = v.kick.take() {
            self.dev.forget_kick(i as usize, old.as_raw_fd());
        }
        // The kick fd is never read with read(2) (see `rings::arm`), so its O_NONBLOCK
        // flag, which the frontend shares and controls, does not matter.
        if i % 2 == 1 {
            self.dev
                .kicks_muted
                .fetch_and(!(1 << (i / 2)), std::sync::atomic::Ordering::AcqRel);
        }
        if let Some(f) = &fd {
            if i % 2 == 1 {
                // Made at the connection already (`Reactor::connected`).
                let wake = self.dev.wake_fds().map_err(Error::ReqHandlerError)?;
                wake.kicks[i as usize / 2]
                    .add(f.as_raw_fd(), 0)
                    .map_err(Error::ReqHandlerError)?;
            }
        }
        v.kick = fd;
        self.maybe_start(i, &mut v);
        Ok(())
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        self.check_eventfd(&fd, "call")?;
        self.vring(u32::from(index))?.lock().call = fd;
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, _fd: Option<File>) -> Result<()> {
        self.vring(u32::from(index))?;
        Ok(())
    }

    fn get_protocol_features(&mut self) -> Result<VhostUserProtocolFeatures> {
        Ok(protocol_features())
    }

    fn set_protocol_features(&mut self, features: u64) -> Result<()> {
        if features & !protocol_features().bits() != 0 {
            return Err(Error::InvalidParam);
        }
        self.acked_protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> Result<u64> {
        // Queue pairs, as DPDK and QEMU's vhost-user-net expect.
        Ok(u64::from(self.dev.pairs))
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<()> {
        if self.acked_features & F_PROTOCOL_FEATURES == 0 {
            return Err(Error::InactiveFeature(
                VhostUserVirtioFeatures::PROTOCOL_FEATURES,
            ));
        }
        let mut v = self.vring(index)?.lock();
        v.enabled = enable;
        self.dev.note_ring(index as usize, &v);
        tracing::debug!(port = %self.dev.name, vring = index, enable, "vring enable");
        Ok(())
    }

    fn get_config(
        &mut self,
        _offset: u32,
        _size: u32,
        _flags: VhostUserConfigFlags,
    ) -> Result<Vec<u8>> {
        Err(unsupported("config space"))
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> Result<()> {
        Err(unsupported("config space"))
    }

    fn set_backend_req_fd(&mut self, _backend: Backend) {}

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> Result<()> {
        Err(unsupported("gpu"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> Result<File> {
        Err(unsupported("shared objects"))
    }

    fn get_inflight_fd(
        &mut self,
        _inflight: &VhostUserInflight,
    ) -> Result<(VhostUserInflight, File)> {
        Err(unsupported("inflight"))
    }

    fn set_inflight_fd(&mut self, _inflight: &VhostUserInflight, _file: File) -> Result<()> {
        Err(unsupported("inflight"))
    }

    fn get_max_mem_slots(&mut self) -> Result<u64> {
        Ok(MAX_MEM_SLOTS as u64)
    }

    fn add_mem_region(
        &mut self,
        region: &VhostUserSingleMemoryRegion,
        fd: File,
        _postcopy_listening: Option<bool>,
    ) -> Result<Option<VhostUserMemoryRegionBase>> {
        // QEMU gives each queue pair of a multi-queue NIC its own vhost device, all on this
        // one connection, and each adds the guest's RAM: the second and later pairs repeat
        // regions we have. An exact repeat (same guest address, size and frontend address)
        // is the same memory; accept it as a no-op (refusing it as an overlap left those
        // pairs' rings never enabled).
        let (gpa, size, ua) = (region.guest_phys_addr, region.memory_size, region.user_addr);
        if self
            .regions
            .iter()
            .any(|(m, _)| m.gpa == gpa && m.size == size && m.vmm_addr == ua)
        {
            tracing::debug!(port = %self.dev.name, gpa, size, "memory region added again; already mapped");
            return Ok(None);
        }
        if self.regions.len() >= MAX_MEM_SLOTS {
            tracing::warn!(port = %self.dev.name, max = MAX_MEM_SLOTS,
                "memory region beyond the slot limit; refused");
            return Err(Error::InvalidParam);
        }
        let total = self
            .regions
            .iter()
            .try_fold(region.memory_size, |t, (m, _)| t.checked_add(m.size));
        if total.is_none_or(|t| t > self.dev.max_guest_memory) {
            tracing::warn!(port = %self.dev.name, total = ?total, cap = self.dev.max_guest_memory,
                "guest memory larger than the per-port cap; refused");
            return Err(Error::InvalidParam);
        }
        let new = self.map_region(region, fd)?;
        let mut regions = self.regions.clone();
        regions.push(new);
        // Overlaps are refused by vm-memory when the collection is built.
        self.publish_regions(regions)?;
        tracing::debug!(port = %self.dev.name, slots = self.regions.len(), "memory region added");
        Ok(None)
    }

    fn remove_mem_region(&mut self, region: &VhostUserSingleMemoryRegion) -> Result<()> {
        let (gpa, size, ua) = (region.guest_phys_addr, region.memory_size, region.user_addr);
        let Some(i) = self
            .regions
            .iter()
            .position(|(m, _)| m.gpa == gpa && m.size == size && m.vmm_addr == ua)
        else {
            // The other queue pairs' devices remove it too (see `add_mem_region`): the first
            // removal unmapped it. Nothing is mapped there, which is what was asked.
            tracing::debug!(port = %self.dev.name, gpa, size, "memory region to remove is not mapped");
            return Ok(());
        };
        let mut regions = self.regions.clone();
        regions.remove(i);
        self.publish_regions(regions)?;
        tracing::debug!(port = %self.dev.name, slots = self.regions.len(), "memory region removed");
        Ok(())
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> Result<Option<File>> {
        Err(unsupported("device state"))
    }

    fn check_device_state(&mut self) -> Result<()> {
        Err(unsupported("device state"))
    }

    fn get_shmem_config(&mut self) -> Result<VhostUserShMemConfig> {
        Err(unsupported("shared memory"))
    }

    fn set_log_base(&mut self, log: &VhostUserLog, file: File) -> Result<()> {
        // Copies: the message struct is packed.
        let (size, offset) = (log.mmap_size, log.mmap_offset);
        let refuse = |why: &str| {
            tracing::warn!(port = %self.dev.name, size, offset, "dirty log refused: {why}");
            Err(Error::InvalidParam)
        };
        if self.regions.is_empty() {
            return refuse("no memory table yet");
        }
        // One bit per page of guest-physical memory, up to the end of the highest region.
        let needed = self.mem_end().div_ceil(LOG_PAGE).div_ceil(8);
        if size < needed {
            return refuse(&format!("{needed} bytes needed for the guest memory"));
        }
        // The log lives in the frontend's file like guest memory does; unlike guest memory
        // it is only ever written through atomics outside the SIGBUS table, so it must be
        // sealed against shrinking (QEMU's vhost log memfd is created sealed).
        match guestmap::seal_against_shrink(&file) {
            Ok(guestmap::Seal::Sealed | guestmap::Seal::Added) => {}
            Ok(guestmap::Seal::Unsealable) => {
                return refuse("the file cannot be sealed against shrinking")
            }
            Err(e) => return refuse(&format!("F_SEAL_SHRINK: {e}")),
        }
        let file_len = file.metadata().map_err(Error::ReqHandlerError)?.len();
        if offset.checked_add(size).is_none_or(|end| end > file_len) {
            return refuse("larger than its file");
        }
        let map = DirtyLog::map(&file, size, offset).map_err(|e| {
            tracing::warn!(port = %self.dev.name, error = %e, "dirty log not mapped");
            Error::ReqHandlerError(e)
        })?;
        self.dev.log.store(Some(Arc::new(map)));
        self.dev.update_logging();
        tracing::info!(port = %self.dev.name, size, "dirty log mapped");
        Ok(())
    }
}
