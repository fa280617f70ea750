//! Walking a split-virtqueue descriptor chain that an untrusted guest wrote.
//!
//! `virtio-queue`'s own iterator ends a chain silently on any error; a switch needs to know
//! *why* a chain is bad, to count it and to stop a queue whose driver is broken. This walker
//! reads each 16-byte descriptor through `GuestMemory` (bounds-checked), follows `NEXT` links
//! and one level of `INDIRECT` tables, and returns the segments or a [`ChainError`].
//!
//! Guarantees, whatever the guest wrote: it terminates after at most [`MAX_SEGS`] descriptors
//! (loops and over-long chains are errors), never reads outside guest memory, never follows a
//! nested indirect table, and never overflows a length.

use virtio_bindings::virtio_ring;
use vm_memory::{Address, GuestAddress};

use super::mem::GuestView;

/// Most descriptors one chain may have, direct and indirect together.
pub const MAX_SEGS: usize = 1024;
/// `VRING_DESC_F_NEXT` (virtio-bindings), as the descriptor's 16-bit field.
pub const F_NEXT: u16 = virtio_ring::VRING_DESC_F_NEXT as u16;
/// `VRING_DESC_F_WRITE`.
pub const F_WRITE: u16 = virtio_ring::VRING_DESC_F_WRITE as u16;
/// `VRING_DESC_F_INDIRECT`.
pub const F_INDIRECT: u16 = virtio_ring::VRING_DESC_F_INDIRECT as u16;
const DESC_SIZE: u64 = 16;

/// One buffer of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    pub addr: u64,
    pub len: u32,
    /// Device-writable (the guest's receive buffers).
    pub write: bool,
}

/// Why a chain was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainError {
    /// The head or a `next` index is not below the queue (or indirect table) size.
    IndexOutOfRange,
    /// A descriptor (or an indirect table) lies outside guest memory.
    OutOfMemory,
    /// More than [`MAX_SEGS`] descriptors: a loop, or a chain longer than the queue.
    TooLong,
    /// An indirect table inside an indirect table, or `INDIRECT` together with `NEXT`.
    NestedIndirect,
    /// An indirect table whose length is zero or not a multiple of 16, or too large.
    BadIndirect,
    /// The buffers add up to more than 4 GiB.
    LengthOverflow,
}

impl ChainError {
    /// For logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ChainError::IndexOutOfRange => "descriptor index out of range",
            ChainError::OutOfMemory => "descriptor outside guest memory",
            ChainError::TooLong => "descriptor chain loops or is too long",
            ChainError::NestedIndirect => "nested indirect descriptor table",
            ChainError::BadIndirect => "malformed indirect descriptor table",
            ChainError::LengthOverflow => "descriptor chain longer than 4 GiB",
        }
    }
}

#[derive(Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

#[inline(always)]
fn read_desc(mem: &GuestView<'_>, table: GuestAddress, index: u16) -> Result<Desc, ChainError> {
    let addr = table
        .checked_add(u64::from(index) * DESC_SIZE)
        .ok_or(ChainError::OutOfMemory)?;
    let [addr, w] = mem.read_desc(addr.0).ok_or(ChainError::OutOfMemory)?;
    Ok(Desc {
        addr,
        len: w as u32,
        flags: (w >> 32) as u16,
        next: (w >> 48) as u16,
    })
}

/// Walks the chain starting at `head` of a queue of `queue_size` entries whose descriptor
/// table is at `table`. Fills `out` (cleared first) and returns the total length.
pub fn walk(
    mem: &GuestView<'_>,
    table: GuestAddress,
    queue_size: u16,
    head: u16,
    out: &mut Vec<Seg>,
) -> Result<u32, ChainError> {
    out.clear();
    walk_append(mem, table, queue_size, head, out)
}

/// Like [`walk`], but appends the chain's segments to `out` (a burst's chains side by side).
/// On error `out` is left as it was.
pub fn walk_append(
    mem: &GuestView<'_>,
    table: GuestAddress,
    queue_size: u16,
    head: u16,
    out: &mut Vec<Seg>,
) -> Result<u32, ChainError> {
    let base = out.len();
    let r = walk_from(mem, table, queue_size, head, out, base);
    if r.is_err() {
        out.truncate(base);
    }
    r
}

fn walk_from(
    mem: &GuestView<'_>,
    table: GuestAddress,
    queue_size: u16,
    head: u16,
    out: &mut Vec<Seg>,
    base: usize,
) -> Result<u32, ChainError> {
    let mut total: u32 = 0;
    let mut push = |out: &mut Vec<Seg>, d: &Desc| -> Result<(), ChainError> {
        if out.len() - base >= MAX_SEGS {
            return Err(ChainError::TooLong);
        }
        total = total.checked_add(d.len).ok_or(ChainError::LengthOverflow)?;
        if d.len > 0 && !mem.check(d.addr, d.len as usize) {
            return Err(ChainError::OutOfMemory);
        }
        out.push(Seg {
            addr: d.addr,
            len: d.len,
            write: d.flags & F_WRITE != 0,
        });
        Ok(())
    };
    if head >= queue_size {
        return Err(ChainError::IndexOutOfRange);
    }
    let mut index = head;
    let mut steps = 0usize;
    loop {
        steps += 1;
        if steps > usize::from(queue_size).min(MAX_SEGS) {
            return Err(ChainError::TooLong);
        }
        let d = read_desc(mem, table, index)?;
        if d.flags & F_INDIRECT != 0 {
            if d.flags & F_NEXT != 0 {
                return Err(ChainError::NestedIndirect);
            }
            walk_indirect(mem, &d, out, &mut push)?;
            break;
        }
        push(out, &d)?;
        if d.flags & F_NEXT == 0 {
            break;
        }
        if d.next >= queue_size {
            return Err(ChainError::IndexOutOfRange);
        }
        index = d.next;
    }
    Ok(total)
}

fn walk_indirect(
    mem: &GuestView<'_>,
    d: &Desc,
    out: &mut Vec<Seg>,
    push: &mut impl FnMut(&mut Vec<Seg>, &Desc) -> Result<(), ChainError>,
) -> Result<(), ChainError> {
    if d.len == 0
        || u64::from(d.len) % DESC_SIZE != 0
        || u64::from(d.len) / DESC_SIZE > MAX_SEGS as u64
    {
        return Err(ChainError::BadIndirect);
    }
    let table = GuestAddress(d.addr);
    if !mem.check(table.0, d.len as usize) {
        return Err(ChainError::OutOfMemory);
    }
    let n = (u64::from(d.len) / DESC_SIZE) as u16;
    let mut index = 0u16;
    for _ in 0..n {
        let d = read_desc(mem, table, index)?;
        if d.flags & F_INDIRECT != 0 {
            return Err(ChainError::NestedIndirect);
        }
        push(out, &d)?;
        if d.flags & F_NEXT == 0 {
            return Ok(());
        }
        if d.next >= n {
            return Err(ChainError::IndexOutOfRange);
        }
        index = d.next;
    }
    Err(ChainError::TooLong)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::vhost_user::GuestMem as GuestMemoryMmap;
    use vm_memory::Bytes;

    const TABLE: u64 = 0x1000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    fn put(mem: &GuestMemoryMmap, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&b, GuestAddress(table + u64::from(i) * 16))
            .unwrap();
    }

    fn w(m: &GuestMemoryMmap, head: u16) -> Result<Vec<Seg>, ChainError> {
        let mut out = Vec::new();
        walk(&GuestView::new(m), GuestAddress(TABLE), 256, head, &mut out).map(|_| out)
    }

    #[test]
    fn direct_chain() {
        let m = mem();
        put(&m, TABLE, 0, 0x4000, 12, F_NEXT, 5);
        put(&m, TABLE, 5, 0x5000, 1500, 0, 0);
        let segs = w(&m, 0).unwrap();
        assert_eq!(segs.len(), 2);
        assert_eq!(
            segs[1],
            Seg {
                addr: 0x5000,
                len: 1500,
                write: false
            }
        );
    }

    #[test]
    fn indirect_chain() {
        let m = mem();
        put(&m, TABLE, 3, 0x8000, 32, F_INDIRECT, 0);
        put(&m, 0x8000, 0, 0x4000, 12, F_NEXT | F_WRITE, 1);
        put(&m, 0x8000, 1, 0x5000, 2048, F_WRITE, 0);
        let segs = w(&m, 3).unwrap();
        assert_eq!(segs.len(), 2);
        assert!(segs.iter().all(|s| s.write));
    }

    #[test]
    fn hostile_chains_are_rejected() {
        let m = mem();
        assert_eq!(w(&m, 256), Err(ChainError::IndexOutOfRange));
        // Loop: 0 -> 1 -> 0.
        put(&m, TABLE, 0, 0x4000, 10, F_NEXT, 1);
        put(&m, TABLE, 1, 0x4000, 10, F_NEXT, 0);
        assert_eq!(w(&m, 0), Err(ChainError::TooLong));
        // Buffer outside memory.
        put(&m, TABLE, 2, 0xfff0, 0x100, 0, 0);
        assert_eq!(w(&m, 2), Err(ChainError::OutOfMemory));
        put(&m, TABLE, 2, u64::MAX - 4, 16, 0, 0);
        assert_eq!(w(&m, 2), Err(ChainError::OutOfMemory));
        // Next out of range.
        put(&m, TABLE, 3, 0x4000, 10, F_NEXT, 999);
        assert_eq!(w(&m, 3), Err(ChainError::IndexOutOfRange));
        // Nested indirect.
        put(&m, TABLE, 4, 0x8000, 16, F_INDIRECT, 0);
        put(&m, 0x8000, 0, 0x9000, 16, F_INDIRECT, 0);
        assert_eq!(w(&m, 4), Err(ChainError::NestedIndirect));
        // INDIRECT with NEXT.
        put(&m, TABLE, 5, 0x8000, 16, F_INDIRECT | F_NEXT, 6);
        assert_eq!(w(&m, 5), Err(ChainError::NestedIndirect));
        // Indirect table of a bad length.
        put(&m, TABLE, 6, 0x8000, 17, F_INDIRECT, 0);
        assert_eq!(w(&m, 6), Err(ChainError::BadIndirect));
        put(&m, TABLE, 6, 0x8000, 0, F_INDIRECT, 0);
        assert_eq!(w(&m, 6), Err(ChainError::BadIndirect));
        // Loop inside an indirect table.
        put(&m, TABLE, 7, 0xa000, 32, F_INDIRECT, 0);
        put(&m, 0xa000, 0, 0x4000, 1, F_NEXT, 1);
        put(&m, 0xa000, 1, 0x4000, 1, F_NEXT, 0);
        assert_eq!(w(&m, 7), Err(ChainError::TooLong));
        // Lengths that overflow u32.
        put(&m, TABLE, 8, 0x4000, u32::MAX, F_NEXT, 9);
        put(&m, TABLE, 9, 0x4000, 2, 0, 0);
        let r = w(&m, 8);
        assert!(
            matches!(
                r,
                Err(ChainError::LengthOverflow) | Err(ChainError::OutOfMemory)
            ),
            "{r:?}"
        );
        // Descriptor table itself outside memory.
        let mut out = Vec::new();
        assert_eq!(
            walk(&GuestView::new(&m), GuestAddress(0xfff8), 256, 0, &mut out),
            Err(ChainError::OutOfMemory)
        );
    }

    #[test]
    fn never_panics_on_random_tables() {
        use proptest::prelude::*;
        proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..4096), head in 0u16..300, qs in 1u16..512)| {
            let m = mem();
            m.write_slice(&bytes, GuestAddress(TABLE)).unwrap();
            let mut out = Vec::new();
            let _ = walk(&GuestView::new(&m), GuestAddress(TABLE), qs, head, &mut out);
            prop_assert!(out.len() <= MAX_SEGS);
        });
    }
}
