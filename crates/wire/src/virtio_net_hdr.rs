//! The virtio-net header (virtio spec 1.x, section 5.1.6) that precedes every frame on a TAP
//! device opened with `IFF_VNET_HDR` and on virtio-net queues.
//!
//! It carries the offloads: a checksum left for "hardware" to complete
//! ([`FLAG_NEEDS_CSUM`], see [`checksum::complete_partial`](crate::checksum::complete_partial))
//! and segmentation of a super-frame into `gso_size` pieces (GSO/TSO). Fields are
//! little-endian, as with `VIRTIO_F_VERSION_1` and as TAP uses them on little-endian hosts.
//! The header is [`LEN`] bytes when `num_buffers` is present (`VIRTIO_F_VERSION_1` or
//! `VIRTIO_NET_F_MRG_RXBUF`; TAP with `TUNSETVNETHDRSZ` 12) and [`LEN_LEGACY`] bytes otherwise.
//!
//! Unlike the views of the other modules, [`VirtioNetHdr`] is parsed into a plain struct: it is
//! small, read once per frame, and often built from scratch.

use core::fmt;

use crate::flow;
use crate::{tcp, udp, Error, IpProtocol, Result};

/// Length of the header with `num_buffers`.
pub const LEN: usize = 12;
/// Length of the legacy header, without `num_buffers`.
pub const LEN_LEGACY: usize = 10;

/// `flags`: the checksum from `csum_start` on must be completed; the field at
/// `csum_start + csum_offset` holds the pseudo-header sum.
pub const FLAG_NEEDS_CSUM: u8 = 1;
/// `flags`: the checksum was validated.
pub const FLAG_DATA_VALID: u8 = 2;

/// `gso_type`: not a super-frame.
pub const GSO_NONE: u8 = 0;
/// `gso_type`: TCP over IPv4 segmentation.
pub const GSO_TCPV4: u8 = 1;
/// `gso_type`: UDP fragmentation offload (UFO).
pub const GSO_UDP: u8 = 3;
/// `gso_type`: TCP over IPv6 segmentation.
pub const GSO_TCPV6: u8 = 4;
/// `gso_type`: UDP segmentation (USO).
pub const GSO_UDP_L4: u8 = 5;
/// `gso_type` bit: the TCP segments carry ECN (CWR must go in the first segment only).
pub const GSO_ECN: u8 = 0x80;
/// Smallest `gso_size` accepted. Linux never sends an MSS below `TCP_MIN_MSS` (88) less the
/// TCP options it carries; a smaller one only multiplies the segments of a frame (64 KiB at a
/// `gso_size` of 1 would be 65 000 segments).
pub const MIN_GSO_SIZE: u16 = 64;

/// A virtio-net header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VirtioNetHdr {
    /// `FLAG_*` bits.
    pub flags: u8,
    /// One of the `GSO_*` types, possibly with [`GSO_ECN`].
    pub gso_type: u8,
    /// Length of the headers to replicate into each segment (a hint; may be 0 or too small).
    pub hdr_len: u16,
    /// Bytes of payload per segment, headers excluded.
    pub gso_size: u16,
    /// Where checksumming starts, from the start of the frame.
    pub csum_start: u16,
    /// Where the checksum goes, from `csum_start`.
    pub csum_offset: u16,
    /// Number of merged receive buffers; 0 in the legacy header.
    pub num_buffers: u16,
}

/// Why [`VirtioNetHdr::validate`] rejected a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HdrError {
    /// `gso_type` is not a known type, or is [`GSO_ECN`] with no type.
    UnknownGsoType,
    /// A GSO type with a `gso_size` of 0.
    MissingGsoSize,
    /// [`FLAG_NEEDS_CSUM`] with a checksum field beyond the end of the frame.
    CsumOutOfRange,
    /// A GSO type with `hdr_len` beyond the end of the frame.
    HdrLenOutOfRange,
    /// A GSO type with a `gso_size` below [`MIN_GSO_SIZE`]: thousands of segments from one
    /// frame, a way to make the switch segment for a long time.
    GsoSizeTooSmall,
}

impl fmt::Display for HdrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HdrError::UnknownGsoType => "unknown virtio-net GSO type",
            HdrError::MissingGsoSize => "virtio-net GSO without gso_size",
            HdrError::CsumOutOfRange => "virtio-net checksum offset beyond the frame",
            HdrError::HdrLenOutOfRange => "virtio-net hdr_len beyond the frame",
            HdrError::GsoSizeTooSmall => "virtio-net gso_size below the minimum",
        })
    }
}

impl std::error::Error for HdrError {}

impl VirtioNetHdr {
    /// Reads a header from the start of `bytes`: [`LEN_LEGACY`] bytes, and `num_buffers` when
    /// there are [`LEN`] (0 otherwise). Fails with [`Error::Truncated`] on fewer than
    /// [`LEN_LEGACY`] bytes.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < LEN_LEGACY {
            return Err(Error::Truncated);
        }
        let le16 = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        Ok(VirtioNetHdr {
            flags: bytes[0],
            gso_type: bytes[1],
            hdr_len: le16(2),
            gso_size: le16(4),
            csum_start: le16(6),
            csum_offset: le16(8),
            num_buffers: if bytes.len() >= LEN { le16(10) } else { 0 },
        })
    }

    /// Writes the header to the start of `out`: `min(out.len(), LEN)` bytes, so a
    /// [`LEN_LEGACY`]-byte buffer gets the legacy header. Callers must pass at least
    /// [`LEN_LEGACY`] bytes (checked in debug builds); a shorter `out` gets a cut-off header.
    #[inline]
    pub fn emit(&self, out: &mut [u8]) {
        debug_assert!(
            out.len() >= LEN_LEGACY,
            "virtio-net header buffer too short"
        );
        let mut bytes = [0; LEN];
        bytes[0] = self.flags;
        bytes[1] = self.gso_type;
        let fields = [
            self.hdr_len,
            self.gso_size,
            self.csum_start,
            self.csum_offset,
            self.num_buffers,
        ];
        for (chunk, field) in bytes[2..].chunks_exact_mut(2).zip(fields) {
            chunk.copy_from_slice(&field.to_le_bytes());
        }
        let len = out.len().min(LEN);
        out[..len].copy_from_slice(&bytes[..len]);
    }

    /// Whether the frame is a super-frame to be segmented.
    #[inline]
    pub fn is_gso(&self) -> bool {
        self.gso_type & !GSO_ECN != GSO_NONE
    }

    /// Validates the header against the frame it describes, `frame_len` bytes long. Rejects
    /// what Linux rejects: unknown GSO types (including [`GSO_ECN`] alone), GSO without
    /// `gso_size`, [`FLAG_NEEDS_CSUM`] with `csum_start + csum_offset + 2 > frame_len`, and GSO
    /// with `hdr_len > frame_len`; and, stricter than Linux, GSO with a `gso_size` below
    /// [`MIN_GSO_SIZE`].
    pub fn validate(&self, frame_len: usize) -> core::result::Result<(), HdrError> {
        if self.gso_type != GSO_NONE
            && !matches!(
                self.gso_type & !GSO_ECN,
                GSO_TCPV4 | GSO_UDP | GSO_TCPV6 | GSO_UDP_L4
            )
        {
            return Err(HdrError::UnknownGsoType);
        }
        if self.is_gso() && self.gso_size == 0 {
            return Err(HdrError::MissingGsoSize);
        }
        if self.is_gso() && self.gso_size < MIN_GSO_SIZE {
            return Err(HdrError::GsoSizeTooSmall);
        }
        let csum_end = usize::from(self.csum_start) + usize::from(self.csum_offset) + 2;
        if self.flags & FLAG_NEEDS_CSUM != 0 && csum_end > frame_len {
            return Err(HdrError::CsumOutOfRange);
        }
        if self.is_gso() && usize::from(self.hdr_len) > frame_len {
            return Err(HdrError::HdrLenOutOfRange);
        }
        Ok(())
    }

    /// The number of frames this one becomes on the wire and their total length in bytes
    /// (L2 up, no FCS), for metering.
    ///
    /// Without GSO (or with a `gso_size` of 0) that is the frame itself. With GSO, each segment
    /// carries the headers, as parsed from the frame (Ethernet, an optional 802.1Q tag, IPv4
    /// with options or IPv6 with extension headers, TCP with options or UDP), or `hdr_len` if
    /// the frame cannot be parsed, and up to `gso_size` bytes of the rest. UFO
    /// ([`GSO_UDP`]) is counted the same way, although its IP fragments after the first
    /// actually carry no UDP header. Never panics.
    #[inline]
    pub fn wire_frames(&self, frame: &[u8]) -> (u32, u64) {
        if !self.is_gso() || self.gso_size == 0 {
            return (1, frame.len() as u64);
        }
        self.wire_frames_gso(frame)
    }

    /// [`VirtioNetHdr::wire_frames`] of a super-frame, out of line: the per-frame call of
    /// the data path is then a flag test for the frames that are not.
    #[inline(never)]
    fn wire_frames_gso(&self, frame: &[u8]) -> (u32, u64) {
        let frame_len = frame.len() as u64;
        let headers = headers_len(frame)
            .unwrap_or(usize::from(self.hdr_len))
            .min(frame.len()) as u64;
        let payload = frame_len - headers;
        let frames = payload.div_ceil(u64::from(self.gso_size)).max(1);
        let bytes = frames.saturating_mul(headers).saturating_add(payload);
        (u32::try_from(frames).unwrap_or(u32::MAX), bytes)
    }
}

/// The length of the L2, L3 and L4 headers of a TCP or UDP frame.
fn headers_len(frame: &[u8]) -> Option<usize> {
    let l3 = flow::parse_l3(frame)?;
    let l4_len = match l3.proto {
        IpProtocol::Tcp => usize::from(tcp::Packet::new_checked(l3.l4).ok()?.header_len()),
        IpProtocol::Udp if l3.l4.len() >= udp::HEADER_LEN => udp::HEADER_LEN,
        _ => return None,
    };
    Some(l3.l4_offset + l4_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::complete_partial;
    use crate::testdata::{TCP_SYN, UDP4, UDP4_PARTIAL, UDP6, VLAN_UDP4};
    use proptest::prelude::*;

    /// The header Linux puts before [`UDP4_PARTIAL`] on a TAP with `IFF_VNET_HDR`:
    /// NEEDS_CSUM, csum_start 34 (Ethernet + IPv4), csum_offset 6 (UDP checksum).
    static UDP4_PARTIAL_HDR: [u8; LEN] = [0x01, 0x00, 0, 0, 0, 0, 0x22, 0x00, 0x06, 0x00, 0, 0];

    /// A TSO header for a TCPv4 super-frame with the headers of [`TCP_SYN`] (74 bytes) and an
    /// MSS of 1448, as a Linux guest sends it.
    const TSO: VirtioNetHdr = VirtioNetHdr {
        flags: FLAG_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 74,
        gso_size: 1448,
        csum_start: 34,
        csum_offset: 16,
        num_buffers: 0,
    };

    fn super_frame(headers: &[u8], payload: usize) -> Vec<u8> {
        let mut frame = headers.to_vec();
        frame.resize(headers.len() + payload, 0xaa);
        frame
    }

    #[test]
    fn parse_and_complete_a_partial_checksum() {
        let hdr = VirtioNetHdr::parse(&UDP4_PARTIAL_HDR).unwrap();
        assert_eq!(
            hdr,
            VirtioNetHdr {
                flags: FLAG_NEEDS_CSUM,
                csum_start: 34,
                csum_offset: 6,
                ..VirtioNetHdr::default()
            }
        );
        assert!(!hdr.is_gso());
        assert_eq!(hdr.validate(UDP4_PARTIAL.len()), Ok(()));
        assert_eq!(hdr.wire_frames(&UDP4_PARTIAL), (1, 64));

        let mut frame = UDP4_PARTIAL;
        let (start, offset) = (usize::from(hdr.csum_start), usize::from(hdr.csum_offset));
        complete_partial(&mut frame, start, offset).unwrap();
        assert_eq!(&frame[34..], &UDP4[34..]);
    }

    #[test]
    fn legacy_and_mergeable_lengths() {
        let mut bytes = UDP4_PARTIAL_HDR;
        bytes[10] = 3;
        assert_eq!(VirtioNetHdr::parse(&bytes).unwrap().num_buffers, 3);
        assert_eq!(VirtioNetHdr::parse(&bytes[..11]).unwrap().num_buffers, 0);
        assert_eq!(VirtioNetHdr::parse(&bytes[..10]).unwrap().num_buffers, 0);
        assert_eq!(VirtioNetHdr::parse(&bytes[..9]), Err(Error::Truncated));
    }

    #[test]
    fn emit_round_trips() {
        let hdr = VirtioNetHdr {
            num_buffers: 0x0102,
            gso_type: GSO_TCPV6 | GSO_ECN,
            ..TSO
        };
        let mut out = [0xff; 16];
        hdr.emit(&mut out);
        assert_eq!(
            out,
            [1, 0x84, 74, 0, 0xa8, 0x05, 34, 0, 16, 0, 0x02, 0x01, 0xff, 0xff, 0xff, 0xff]
        );
        assert_eq!(VirtioNetHdr::parse(&out), Ok(hdr));

        let mut legacy = [0xff; LEN_LEGACY];
        hdr.emit(&mut legacy);
        assert_eq!(legacy, out[..LEN_LEGACY]);

        let mut out = [0xff; LEN];
        VirtioNetHdr::parse(&UDP4_PARTIAL_HDR)
            .unwrap()
            .emit(&mut out);
        assert_eq!(out, UDP4_PARTIAL_HDR);
    }

    #[test]
    fn validate() {
        let len = 74 + 4000;
        assert_eq!(TSO.validate(len), Ok(()));
        for (hdr, error) in [
            (
                VirtioNetHdr { gso_type: 2, ..TSO },
                HdrError::UnknownGsoType,
            ),
            (
                VirtioNetHdr { gso_type: 6, ..TSO },
                HdrError::UnknownGsoType,
            ),
            (
                VirtioNetHdr {
                    gso_type: GSO_ECN,
                    ..TSO
                },
                HdrError::UnknownGsoType,
            ),
            (
                VirtioNetHdr { gso_size: 0, ..TSO },
                HdrError::MissingGsoSize,
            ),
            (
                VirtioNetHdr {
                    gso_size: MIN_GSO_SIZE - 1,
                    ..TSO
                },
                HdrError::GsoSizeTooSmall,
            ),
            (
                VirtioNetHdr {
                    csum_offset: 4039,
                    ..TSO
                },
                HdrError::CsumOutOfRange,
            ),
            (
                VirtioNetHdr {
                    hdr_len: 4075,
                    ..TSO
                },
                HdrError::HdrLenOutOfRange,
            ),
        ] {
            assert_eq!(hdr.validate(len), Err(error), "{hdr:?}");
            assert!(!error.to_string().is_empty());
        }
        // The checksum field may end exactly at the end of the frame.
        assert_eq!(
            VirtioNetHdr {
                csum_offset: 4038,
                ..TSO
            }
            .validate(len),
            Ok(())
        );
        // Without the flags that use them, the fields are not checked.
        let plain = VirtioNetHdr {
            csum_start: u16::MAX,
            hdr_len: u16::MAX,
            ..VirtioNetHdr::default()
        };
        assert_eq!(plain.validate(60), Ok(()));
        let ecn = VirtioNetHdr {
            gso_type: GSO_TCPV4 | GSO_ECN,
            ..TSO
        };
        assert!(ecn.is_gso());
        assert_eq!(ecn.validate(len), Ok(()));
    }

    #[test]
    fn tso_segments() {
        // 4000 bytes of payload at 1448 per segment: 1448 + 1448 + 1104.
        let frame = super_frame(&TCP_SYN, 4000);
        assert_eq!(TSO.wire_frames(&frame), (3, 3 * 74 + 4000));
        // The headers come from the frame, not from hdr_len.
        let hint = VirtioNetHdr { hdr_len: 0, ..TSO };
        assert_eq!(hint.wire_frames(&frame), (3, 3 * 74 + 4000));
        // Exactly one segment's worth, and no payload at all.
        assert_eq!(
            TSO.wire_frames(&super_frame(&TCP_SYN, 1448)),
            (1, 74 + 1448)
        );
        assert_eq!(TSO.wire_frames(&TCP_SYN), (1, 74));
    }

    #[test]
    fn uso_segments_tagged_and_ipv6() {
        let uso = VirtioNetHdr {
            gso_type: GSO_UDP_L4,
            gso_size: 1000,
            ..TSO
        };
        // Ethernet + 802.1Q + IPv4 + UDP = 46 bytes of headers.
        let tagged = super_frame(&VLAN_UDP4[..46], 2500);
        assert_eq!(uso.wire_frames(&tagged), (3, 3 * 46 + 2500));
        // Ethernet + IPv6 + UDP = 62 bytes of headers.
        let v6 = super_frame(&UDP6[..62], 1001);
        assert_eq!(uso.wire_frames(&v6), (2, 2 * 62 + 1001));
    }

    #[test]
    fn unparseable_frames_fall_back_to_hdr_len() {
        // Not IP: hdr_len says 74.
        let mut frame = super_frame(&TCP_SYN, 4000);
        frame[12..14].copy_from_slice(&[0x88, 0xb5]);
        assert_eq!(TSO.wire_frames(&frame), (3, 3 * 74 + 4000));
        // hdr_len beyond the frame: the whole frame is headers.
        let hdr = VirtioNetHdr {
            hdr_len: 9000,
            ..TSO
        };
        assert_eq!(hdr.wire_frames(&frame), (1, 4074));
        // gso_size 0 (invalid): counted as one frame.
        let hdr = VirtioNetHdr { gso_size: 0, ..TSO };
        assert_eq!(hdr.wire_frames(&frame), (1, 4074));
    }

    proptest! {
        #[test]
        fn never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            hdr in proptest::array::uniform12(any::<u8>()),
        ) {
            let hdr = VirtioNetHdr::parse(&hdr).unwrap();
            let _ = hdr.validate(bytes.len());
            let (frames, len) = hdr.wire_frames(&bytes);
            prop_assert!(frames >= 1 && len >= bytes.len() as u64);
            prop_assert!(VirtioNetHdr::parse(&bytes).is_ok() == (bytes.len() >= LEN_LEGACY));
        }
    }
}
