//! Raw ring access for hostile-guest tests.

use std::sync::atomic::{fence, Ordering};

use crate::ring::desc_bytes;
use crate::{Driver, Result};

/// Raw access to one vring's memory, to build rings a correct driver never would.
///
/// Obtained from [`Driver::raw`]. All addresses are guest physical addresses (offsets into
/// [`Driver::mem`]). Nothing here checks what you write: descriptors may point anywhere,
/// chains may loop, avail entries and the avail index may take any value.
///
/// The driver's own shadow state (its next avail index, free descriptors, last used index)
/// is **not** changed by these calls, except by [`RawVring::push`]. After raw writes to a
/// vring, the normal [`Driver::send`] / [`Driver::recv`] on that vring may misbehave or
/// report ring violations: use a vring either raw or normally within one test, or restore
/// what you changed.
pub struct RawVring<'a> {
    pub(crate) d: &'a mut Driver,
    pub(crate) v: usize,
}

impl RawVring<'_> {
    /// The vring index (receiveqK = 2K, transmitqK = 2K+1).
    pub fn index(&self) -> u16 {
        self.d.vrings[self.v].index
    }

    /// Number of entries.
    pub fn size(&self) -> u16 {
        self.d.vrings[self.v].l.size
    }

    /// Guest physical address of the descriptor table.
    pub fn desc_table(&self) -> u64 {
        self.d.vrings[self.v].l.desc
    }

    /// Guest physical address of the avail ring (`flags`, `idx`, `ring[]`, `used_event`).
    pub fn avail_ring(&self) -> u64 {
        self.d.vrings[self.v].l.avail
    }

    /// Guest physical address of the used ring (`flags`, `idx`, `ring[]`, `avail_event`).
    pub fn used_ring(&self) -> u64 {
        self.d.vrings[self.v].l.used
    }

    /// The driver's own buffer for descriptor `desc`: (guest physical address, length).
    pub fn buffer(&self, desc: u16) -> (u64, u32) {
        let vr = &self.d.vrings[self.v];
        (vr.buf_addr(desc), vr.buf_len)
    }

    /// Write descriptor `index` of the table (`index` < size; use [`Driver::mem`] to write
    /// beyond the table).
    pub fn write_desc(
        &mut self,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> Result<()> {
        let vr = &self.d.vrings[self.v];
        if index >= vr.l.size {
            return Err(crate::Error::InvalidArgument(format!(
                "descriptor {index} outside a table of {}",
                vr.l.size
            )));
        }
        self.d
            .shm
            .write(vr.l.desc_entry(index), &desc_bytes(addr, len, flags, next))
    }

    /// Read descriptor `index`: (addr, len, flags, next).
    pub fn read_desc(&self, index: u16) -> Result<(u64, u32, u16, u16)> {
        let vr = &self.d.vrings[self.v];
        let mut b = [0u8; 16];
        self.d
            .shm
            .read(vr.l.desc_entry(index % vr.l.size), &mut b)?;
        Ok((
            u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            u16::from_le_bytes([b[12], b[13]]),
            u16::from_le_bytes([b[14], b[15]]),
        ))
    }

    /// Write avail ring entry `slot` (taken modulo the ring size) = `head` (any value).
    pub fn set_avail_entry(&mut self, slot: u16, head: u16) -> Result<()> {
        let l = self.d.vrings[self.v].l;
        self.d
            .shm
            .store16(l.avail_entry(slot), head, Ordering::Relaxed)
    }

    /// Publish an arbitrary avail index (release store). Does not kick.
    pub fn set_avail_idx(&mut self, idx: u16) -> Result<()> {
        let l = self.d.vrings[self.v].l;
        self.d.shm.store16(l.avail_idx(), idx, Ordering::Release)?;
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// The avail index as it is in memory.
    pub fn avail_idx(&self) -> Result<u16> {
        let l = self.d.vrings[self.v].l;
        self.d.shm.load16(l.avail_idx(), Ordering::Acquire)
    }

    /// Write the avail ring's `flags`.
    pub fn set_avail_flags(&mut self, flags: u16) -> Result<()> {
        let l = self.d.vrings[self.v].l;
        self.d
            .shm
            .store16(l.avail_flags(), flags, Ordering::Release)
    }

    /// Write `used_event` (meaningful with EVENT_IDX).
    pub fn set_used_event(&mut self, v: u16) -> Result<()> {
        let l = self.d.vrings[self.v].l;
        self.d.shm.store16(l.used_event(), v, Ordering::Release)
    }

    /// The used index as the device last wrote it.
    pub fn used_idx(&self) -> Result<u16> {
        let l = self.d.vrings[self.v].l;
        self.d.shm.load16(l.used_idx(), Ordering::Acquire)
    }

    /// The used ring's `flags` (device's `NO_NOTIFY`).
    pub fn used_flags(&self) -> Result<u16> {
        let l = self.d.vrings[self.v].l;
        self.d.shm.load16(l.used_flags(), Ordering::Acquire)
    }

    /// The device's `avail_event` (meaningful with EVENT_IDX).
    pub fn avail_event(&self) -> Result<u16> {
        let l = self.d.vrings[self.v].l;
        self.d.shm.load16(l.avail_event(), Ordering::Acquire)
    }

    /// Used element at `slot` (taken modulo the ring size): (id, len).
    pub fn used_elem(&self, slot: u16) -> Result<(u32, u32)> {
        let l = self.d.vrings[self.v].l;
        let mut b = [0u8; 8];
        self.d.shm.read(l.used_elem(slot), &mut b)?;
        Ok((
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        ))
    }

    /// The driver's shadow next-avail index (where [`RawVring::push`] writes).
    pub fn next_avail(&self) -> u16 {
        self.d.vrings[self.v].avail_idx
    }

    /// Append `head` at the driver's next avail slot, publish the index (release) and kick —
    /// the driver's shadow avail index advances. `head` is not checked.
    pub fn push(&mut self, head: u16) -> Result<()> {
        let vr = &mut self.d.vrings[self.v];
        vr.push_avail(&self.d.shm, head)?;
        self.d
            .shm
            .store16(vr.l.avail_idx(), vr.avail_idx, Ordering::Release)?;
        vr.kick_checked = vr.avail_idx;
        fence(Ordering::SeqCst);
        vr.do_kick()
    }

    /// Write 1 to the kick eventfd.
    pub fn kick(&mut self) -> Result<()> {
        self.d.vrings[self.v].do_kick()
    }

    /// Calls (call-eventfd signals) received so far on this vring.
    pub fn calls(&mut self) -> u64 {
        self.d.vrings[self.v].drain_calls()
    }
}
