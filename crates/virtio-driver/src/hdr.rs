//! Feature bits and the virtio-net header.

/// Virtio feature bits (as `u64` masks) that matter to a virtio-net driver over vhost-user.
///
/// Bit numbers are the virtio spec's (virtio-net device bits 0..23, device-independent bits
/// 28..40) plus the vhost-user bit 30.
pub mod features {
    /// Device handles packets with partial checksum (guest → host checksum offload).
    pub const CSUM: u64 = 1 << 0;
    /// Driver handles packets with partial checksum (host → guest).
    pub const GUEST_CSUM: u64 = 1 << 1;
    /// Device reports its MTU in config space.
    pub const MTU: u64 = 1 << 3;
    /// Device has a MAC address in config space.
    pub const MAC: u64 = 1 << 5;
    /// Driver can receive TSOv4 (needs `GUEST_CSUM`).
    pub const GUEST_TSO4: u64 = 1 << 7;
    /// Driver can receive TSOv6 (needs `GUEST_CSUM`).
    pub const GUEST_TSO6: u64 = 1 << 8;
    /// Driver can receive UFO.
    pub const GUEST_UFO: u64 = 1 << 10;
    /// Device can receive TSOv4 (needs `CSUM`).
    pub const HOST_TSO4: u64 = 1 << 11;
    /// Device can receive TSOv6 (needs `CSUM`).
    pub const HOST_TSO6: u64 = 1 << 12;
    /// Driver can merge receive buffers (`num_buffers`).
    pub const MRG_RXBUF: u64 = 1 << 15;
    /// Config space has a status field.
    pub const STATUS: u64 = 1 << 16;
    /// Control virtqueue. The front-end handles it (no control vring is ever given to the
    /// back-end); accepted if offered only so the back-end sees the bit.
    pub const CTRL_VQ: u64 = 1 << 17;
    /// Multiple queue pairs (the guest-side `CTRL_VQ` it needs is the front-end's).
    pub const MQ: u64 = 1 << 22;
    /// Indirect descriptor tables.
    pub const INDIRECT_DESC: u64 = 1 << 28;
    /// `used_event` / `avail_event` notification suppression.
    pub const EVENT_IDX: u64 = 1 << 29;
    /// vhost-user: the back-end supports GET/SET_PROTOCOL_FEATURES.
    pub const PROTOCOL_FEATURES: u64 = 1 << 30;
    /// Virtio 1.0+ (little-endian rings, 12-byte net header).
    pub const VERSION_1: u64 = 1 << 32;
    /// The device uses buffers in the order they were made available (`VIRTIO_F_IN_ORDER`).
    /// The driver then checks every used id against that order.
    pub const IN_ORDER: u64 = 1 << 35;
    /// Packed virtqueues (not implemented by this driver: never accepted).
    pub const RING_PACKED: u64 = 1 << 34;
    /// Hash report in the net header (20-byte header; not implemented: never accepted).
    pub const HASH_REPORT: u64 = 1 << 57;

    /// What [`crate::DriverOptions::default`] accepts when offered.
    pub const DEFAULT: u64 = VERSION_1
        | MRG_RXBUF
        | CSUM
        | GUEST_CSUM
        | HOST_TSO4
        | HOST_TSO6
        | GUEST_TSO4
        | GUEST_TSO6
        | EVENT_IDX
        | IN_ORDER
        | MQ
        | CTRL_VQ
        | PROTOCOL_FEATURES;

    /// Platform IOMMU (needs IOTLB messages; not implemented: never accepted).
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
    /// Extra data in notifications (not implemented: never accepted).
    pub const NOTIFICATION_DATA: u64 = 1 << 38;

    /// Bits this driver never accepts, whatever [`crate::DriverOptions::features`] says.
    pub const UNSUPPORTED: u64 = RING_PACKED | HASH_REPORT | ACCESS_PLATFORM | NOTIFICATION_DATA;

    /// Drop features whose prerequisites are missing (virtio spec 5.1.3.1). MQ is kept
    /// without CTRL_VQ: the control queue belongs to the front-end (QEMU never forwards
    /// CTRL_VQ to a vhost-user back-end), so only the back-end's MQ offer matters.
    pub fn fix_dependencies(mut f: u64) -> u64 {
        if f & GUEST_CSUM == 0 {
            f &= !(GUEST_TSO4 | GUEST_TSO6 | GUEST_UFO);
        }
        if f & CSUM == 0 {
            f &= !(HOST_TSO4 | HOST_TSO6);
        }
        f
    }
}

/// vhost-user protocol feature bits (as `u64` masks) this driver may request.
pub mod protocol_features {
    /// GET_QUEUE_NUM and per-vring enable for multiple queue pairs.
    pub const MQ: u64 = 1 << 0;
    /// NEED_REPLY on every message; the back-end acks with a u64 (0 = success).
    pub const REPLY_ACK: u64 = 1 << 3;
    /// What [`crate::DriverOptions::default`] requests when offered.
    pub const DEFAULT: u64 = MQ | REPLY_ACK;
}

/// The virtio-net header (`struct virtio_net_hdr_v1`), 12 bytes with `VERSION_1` or
/// `MRG_RXBUF`, 10 (no `num_buffers`) otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetHdr {
    /// `NEEDS_CSUM` (1), `DATA_VALID` (2), `RSC_INFO` (4).
    pub flags: u8,
    /// `GSO_NONE` (0), `GSO_TCPV4` (1), `GSO_UDP` (3), `GSO_TCPV6` (4), `GSO_UDP_L4` (5),
    /// optionally `| GSO_ECN` (0x80).
    pub gso_type: u8,
    /// Length of the headers to copy into each segment.
    pub hdr_len: u16,
    /// Segment payload size.
    pub gso_size: u16,
    /// Where checksumming starts (with `NEEDS_CSUM`).
    pub csum_start: u16,
    /// Where, from `csum_start`, the checksum is stored.
    pub csum_offset: u16,
    /// Number of merged receive buffers (rx only; 1 without `MRG_RXBUF`; 0 on tx).
    pub num_buffers: u16,
}

impl NetHdr {
    /// Size of the header with `VERSION_1` or `MRG_RXBUF`.
    pub const LEN: usize = 12;
    /// Size of the legacy header (neither `VERSION_1` nor `MRG_RXBUF`).
    pub const LEGACY_LEN: usize = 10;
    /// `flags`: the checksum at `csum_start + csum_offset` must be completed.
    pub const F_NEEDS_CSUM: u8 = 1;
    /// `flags`: the checksum is known to be valid.
    pub const F_DATA_VALID: u8 = 2;
    /// `gso_type`: not a GSO frame.
    pub const GSO_NONE: u8 = 0;
    /// `gso_type`: TCP over IPv4.
    pub const GSO_TCPV4: u8 = 1;
    /// `gso_type`: UFO.
    pub const GSO_UDP: u8 = 3;
    /// `gso_type`: TCP over IPv6.
    pub const GSO_TCPV6: u8 = 4;
    /// `gso_type`: UDP segmentation (USO).
    pub const GSO_UDP_L4: u8 = 5;
    /// `gso_type` flag: ECN (CWR) set on the TCP segments.
    pub const GSO_ECN: u8 = 0x80;

    /// The 12-byte little-endian encoding.
    pub fn to_bytes(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        b
    }

    /// Decode a 12-byte (or 10-byte legacy, `num_buffers` = 0) header from the start of `b`.
    pub fn from_bytes(b: &[u8]) -> Option<NetHdr> {
        if b.len() < Self::LEGACY_LEN {
            return None;
        }
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(NetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
            num_buffers: if b.len() >= Self::LEN { u(10) } else { 0 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hdr_roundtrip() {
        let h = NetHdr {
            flags: NetHdr::F_NEEDS_CSUM,
            gso_type: NetHdr::GSO_TCPV4,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 3,
        };
        assert_eq!(NetHdr::from_bytes(&h.to_bytes()), Some(h));
        assert_eq!(NetHdr::from_bytes(&[0; 9]), None);
        assert_eq!(NetHdr::from_bytes(&[0; 10]).unwrap().num_buffers, 0);
    }

    #[test]
    fn dependencies() {
        use features::*;
        assert_eq!(fix_dependencies(GUEST_TSO4 | HOST_TSO6 | MQ), MQ);
        let all = DEFAULT;
        assert_eq!(fix_dependencies(all), all);
    }
}
