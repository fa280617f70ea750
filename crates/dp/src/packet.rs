//! Packet buffers and bursts.
//!
//! A [`Pkt`] is one frame in a worker-owned buffer, preceded by [`HEADROOM`] bytes where the
//! 12-byte virtio-net header lives, so a TAP read or write is one syscall with no copy:
//!
//! ```text
//!  0            12                                   12 + len          BUF_SIZE
//!  | vnet hdr   | Ethernet frame ...                 |   unused ...     |
//! ```
//!
//! The offload metadata ([`Pkt::hdr`]) travels with the frame: a TSO super-frame read from a
//! TAP keeps its GSO type and size until it is written out whole to the destination.
//! A [`Burst`] is a worker's fixed set of [`BURST`] buffers, allocated once at start.

use qswitch_sys::placed::PlacedBuf;
use qswitch_wire::l2::MAX_FRAME_LEN;
use qswitch_wire::virtio_net_hdr::{self, VirtioNetHdr};

/// Most frames moved per rx poll (BESS `kMaxBurst`, DPDK's usual burst).
pub const BURST: usize = 32;
/// Bytes before the frame, for the virtio-net header.
pub const HEADROOM: usize = virtio_net_hdr::LEN;
/// Buffer size: headroom, the largest frame, and one spare byte so a read that fills the
/// buffer is recognisably truncated.
pub const BUF_SIZE: usize = HEADROOM + MAX_FRAME_LEN + 1;
/// The span of addresses over which [`Pkt::placed`] spreads a burst's buffers: the set
/// period of a 1 MiB 8-way (or 2 MiB 16-way) L2, the larger of today's per-core L2s.
/// Buffers of [`BUF_SIZE`] (64 KiB + 72 B, for TSO frames) allocated one after another
/// start at nearly the same offset modulo that period, so the first 1.5 KiB of all 32 of
/// a burst's buffers fell on the same few dozen sets of an 8-way L2 and evicted each
/// other between a burst's receive and its transmit: under `bench/callgrind-dpdk.sh`
/// with the L2 simulated as the last level, 87 misses per 1518 B frame where the guests'
/// buffers account for 48. Placed, each buffer's first 4 KiB has sets of its own (and the
/// L1 sets are spread by the `33 * 64` term).
pub const PLACE_PERIOD: usize = 128 * 1024;

/// One frame and its offload metadata.
pub struct Pkt {
    /// [`BUF_SIZE`] bytes, placed by cache colour for [`Pkt::placed`].
    buf: PlacedBuf,
    len: usize,
    /// Offload metadata (GSO, partial checksum) of the frame.
    pub hdr: VirtioNetHdr,
}

impl Pkt {
    /// An empty packet with a full-size buffer.
    pub fn new() -> Pkt {
        Pkt {
            buf: PlacedBuf::new(BUF_SIZE, 1, 0),
            len: 0,
            hdr: VirtioNetHdr::default(),
        }
    }

    /// An empty packet whose buffer starts at cache colour `color` (see [`PLACE_PERIOD`]):
    /// its address modulo [`PLACE_PERIOD`] is `color * 4 KiB + (color * 33 % 64) * 64`,
    /// whatever address the allocator returned ([`PlacedBuf`]). [`Burst::new`] gives its
    /// buffers colours 0..BURST. The allocation is `PLACE_PERIOD` larger than the buffer;
    /// the slack is never written.
    pub fn placed(color: usize) -> Pkt {
        let at = color * 4096 + (color * 33 % 64) * 64;
        Pkt {
            buf: PlacedBuf::new(BUF_SIZE, PLACE_PERIOD, at),
            len: 0,
            hdr: VirtioNetHdr::default(),
        }
    }

    /// The frame.
    #[inline]
    pub fn frame(&self) -> &[u8] {
        &self.buf[HEADROOM..HEADROOM + self.len]
    }

    /// Frame length in bytes.
    #[inline]
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The whole buffer including headroom, for a read that brings its own virtio-net header.
    #[inline]
    pub fn raw_buf_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Space for a frame of up to [`MAX_FRAME_LEN`] bytes; call [`Pkt::set_len`] after writing.
    #[inline]
    pub fn frame_buf_mut(&mut self) -> &mut [u8] {
        &mut self.buf[HEADROOM..]
    }

    /// Sets the frame length (clamped to the buffer).
    #[inline]
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(BUF_SIZE - HEADROOM);
    }

    /// Copies `frame` in, with no offloads. Frames longer than the buffer are truncated
    /// (and then fail the oversize check).
    pub fn fill(&mut self, frame: &[u8]) {
        let n = frame.len().min(BUF_SIZE - HEADROOM);
        self.buf[HEADROOM..HEADROOM + n].copy_from_slice(&frame[..n]);
        self.len = n;
        self.hdr = VirtioNetHdr::default();
    }

    /// Inserts an 802.1Q tag with `tci` after the MAC addresses, moving the rest of the
    /// frame 4 bytes towards the tail (the headroom stays whole), and shifts the offload
    /// offsets with it. False, and nothing changed, when the tagged frame would not fit.
    pub fn push_vlan(&mut self, tci: u16) -> bool {
        let end = HEADROOM + self.len;
        if self.len < 12 || end + 4 > BUF_SIZE {
            return false;
        }
        self.buf.copy_within(HEADROOM + 12..end, HEADROOM + 16);
        self.buf[HEADROOM + 12..HEADROOM + 14].copy_from_slice(&0x8100u16.to_be_bytes());
        self.buf[HEADROOM + 14..HEADROOM + 16].copy_from_slice(&tci.to_be_bytes());
        self.len += 4;
        self.shift_offloads(true);
        true
    }

    /// Removes the 802.1Q tag after the MAC addresses (the caller knows there is one),
    /// moving the rest of the frame 4 bytes towards the head.
    pub fn pop_vlan(&mut self) {
        if self.len < 16 {
            return;
        }
        let end = HEADROOM + self.len;
        self.buf.copy_within(HEADROOM + 16..end, HEADROOM + 12);
        self.len -= 4;
        self.shift_offloads(false);
    }

    fn shift_offloads(&mut self, grow: bool) {
        let shift = |v: u16| {
            if grow {
                v.saturating_add(4)
            } else {
                v.saturating_sub(4)
            }
        };
        if self.hdr.flags & virtio_net_hdr::FLAG_NEEDS_CSUM != 0 {
            self.hdr.csum_start = shift(self.hdr.csum_start);
        }
        if self.hdr.gso_type & !virtio_net_hdr::GSO_ECN != virtio_net_hdr::GSO_NONE
            && self.hdr.hdr_len != 0
        {
            self.hdr.hdr_len = shift(self.hdr.hdr_len);
        }
    }

    /// Writes [`Pkt::hdr`] into the headroom and returns header + frame as one slice,
    /// ready for a TAP write.
    #[inline(always)]
    pub fn with_vnet_hdr(&mut self) -> &[u8] {
        self.hdr.emit(&mut self.buf[..HEADROOM]);
        &self.buf[..HEADROOM + self.len]
    }
}

impl Default for Pkt {
    fn default() -> Self {
        Pkt::new()
    }
}

/// A worker's [`BURST`] packet buffers.
pub struct Burst {
    pub pkts: Vec<Pkt>,
}

impl Burst {
    pub fn new() -> Burst {
        Burst {
            pkts: (0..BURST).map(Pkt::placed).collect(),
        }
    }
}

impl Default for Burst {
    fn default() -> Self {
        Burst::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst's buffers start at their colours whatever the allocator returned, and behave
    /// like unplaced ones.
    #[test]
    fn burst_buffers_are_placed_by_colour() {
        let mut b = Burst::new();
        let mut sets = std::collections::HashMap::new();
        for (k, p) in b.pkts.iter_mut().enumerate() {
            let at = p.raw_buf_mut().as_ptr() as usize % PLACE_PERIOD;
            assert_eq!(at, k * 4096 + (k * 33 % 64) * 64);
            assert_eq!(p.raw_buf_mut().len(), BUF_SIZE);
            // The first 1.5 KiB of the buffers share no set of a 1 MiB 8-way L2 more than
            // two at a time (a buffer starting late in its 4 KiB runs into the next one's).
            for l in 0..24 {
                *sets.entry((at / 64 + l) % (PLACE_PERIOD / 64)).or_insert(0) += 1;
            }
            p.fill(&[7u8; 60]);
            assert_eq!(p.frame(), &[7u8; 60][..]);
            assert!(p.push_vlan(5));
            assert_eq!(p.len(), 64);
        }
        assert!(sets.values().all(|&n| n <= 2));
    }

    #[test]
    fn header_sits_in_headroom() {
        let mut p = Pkt::new();
        p.fill(&[0xaa; 60]);
        p.hdr.gso_size = 1448;
        p.hdr.gso_type = virtio_net_hdr::GSO_TCPV4;
        let out = p.with_vnet_hdr().to_vec();
        assert_eq!(out.len(), HEADROOM + 60);
        assert_eq!(VirtioNetHdr::parse(&out).unwrap().gso_size, 1448);
        assert_eq!(&out[HEADROOM..], &[0xaa; 60]);
    }

    #[test]
    fn vlan_push_and_pop_keep_the_headroom() {
        let mut p = Pkt::new();
        let f: Vec<u8> = (0..60u8).collect();
        p.fill(&f);
        p.hdr.flags = virtio_net_hdr::FLAG_NEEDS_CSUM;
        p.hdr.csum_start = 34;
        assert!(p.push_vlan(0x2064));
        assert_eq!(p.len(), 64);
        assert_eq!(&p.frame()[..12], &f[..12]);
        assert_eq!(&p.frame()[12..16], &[0x81, 0x00, 0x20, 0x64]);
        assert_eq!(&p.frame()[16..], &f[12..]);
        assert_eq!(p.hdr.csum_start, 38);
        assert_eq!(p.with_vnet_hdr().len(), HEADROOM + 64);
        p.pop_vlan();
        assert_eq!(p.frame(), &f[..]);
        assert_eq!(p.hdr.csum_start, 34);
        // A frame that would not fit tagged is left alone.
        p.set_len(BUF_SIZE - HEADROOM - 3);
        assert!(!p.push_vlan(1));
        assert_eq!(p.len(), BUF_SIZE - HEADROOM - 3);
    }

    #[test]
    fn fill_truncates_instead_of_panicking() {
        let mut p = Pkt::new();
        p.fill(&vec![1u8; BUF_SIZE * 2]);
        assert_eq!(p.len(), BUF_SIZE - HEADROOM);
        assert!(p.len() > MAX_FRAME_LEN);
    }
}
