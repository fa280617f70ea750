//! The software GRO of the VXLAN receive path. The input is read two ways:
//! - as frames (a length byte pair, then the bytes): whatever GRO makes of them must not
//!   panic, and a super-frame it finishes must be within 64 KiB of IP packet;
//! - as a TSO frame (an MSS byte pair, then the frame) segmented by `gso`, with the
//!   segments fed in an order and with drops the first bytes pick: every super-frame GRO
//!   builds, completed and segmented again, must give back exactly the segments it merged
//!   (IPv4 identification numbers aside when DF is set: GRO does not keep them).
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_wire::checksum;
use qswitch_wire::gro::{self, Gro};
use qswitch_wire::gso;
use qswitch_wire::virtio_net_hdr::{VirtioNetHdr, GSO_TCPV4, GSO_TCPV6};

/// Feeds `frames` through one GRO; returns each output with the inputs it holds.
fn run(frames: &[Vec<u8>]) -> Vec<(Vec<u8>, VirtioNetHdr, Vec<Vec<u8>>)> {
    let mut gro = Gro::new();
    let mut buf = vec![0u8; 70_000];
    let mut out = Vec::new();
    let mut merged: Vec<Vec<u8>> = Vec::new();
    for f in frames {
        let Some(seg) = gro::parse(f) else {
            continue;
        };
        if gro.append(&mut buf, f, &seg) {
            merged.push(f.clone());
            continue;
        }
        if let Some((len, hdr)) = gro.finish(&mut buf) {
            assert!(len - 14 <= 65_535 + 40 + 4);
            out.push((buf[..len].to_vec(), hdr, std::mem::take(&mut merged)));
        }
        if gro.start(&mut buf, f, seg) {
            merged.push(f.clone());
        } else {
            // A bad TCP checksum: the frame goes on alone, as received.
            out.push((f.clone(), VirtioNetHdr::default(), vec![f.clone()]));
        }
    }
    if let Some((len, hdr)) = gro.finish(&mut buf) {
        out.push((buf[..len].to_vec(), hdr, merged));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    // Frames.
    let mut frames = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        frames.push(rest[2..2 + n].to_vec());
        rest = &rest[2 + n..];
    }
    let _ = run(&frames);

    // A TSO frame, segmented, shuffled a little, coalesced again.
    if data.len() < 4 {
        return;
    }
    let mss = u16::from_le_bytes([data[0], data[1]]).max(64);
    let pick = data[2];
    let frame = &data[3..];
    for gso_type in [GSO_TCPV4, GSO_TCPV6] {
        let hdr = VirtioNetHdr {
            gso_type,
            gso_size: mss,
            ..Default::default()
        };
        let mut scratch = vec![0u8; 70_000];
        let mut segs = Vec::new();
        if gso::segment(frame, &hdr, &mut scratch, |s| segs.push(s.to_vec())).is_err() {
            continue;
        }
        // Drop one segment, or swap two neighbours, as `pick` says.
        if segs.len() > 2 {
            let at = usize::from(pick) % (segs.len() - 1);
            if pick & 0x80 != 0 {
                segs.remove(at);
            } else {
                segs.swap(at, at + 1);
            }
        }
        for (f, h, parts) in run(&segs) {
            if !gro::is_super(&h) {
                assert_eq!(parts.len(), 1);
                assert_eq!(f, parts[0]);
                continue;
            }
            let mut f = f;
            checksum::complete_partial(&mut f, h.csum_start.into(), h.csum_offset.into()).unwrap();
            let mut again = Vec::new();
            gso::segment(&f, &h, &mut scratch, |s| again.push(s.to_vec())).unwrap();
            assert_eq!(again.len(), parts.len());
            for (a, p) in again.iter_mut().zip(&parts) {
                assert_eq!(a.len(), p.len());
                let mut p = p.clone();
                // With DF, IPv4 identification numbers are not kept (RFC 6864): compare
                // without them and the header checksum that covers them.
                let seg = gro::parse(&p).unwrap();
                if !seg.v6 && p[seg.l3 + 6] & 0x40 != 0 {
                    for b in [&mut *a, &mut p] {
                        b[seg.l3 + 4..seg.l3 + 6].fill(0);
                        b[seg.l3 + 10..seg.l3 + 12].fill(0);
                    }
                }
                assert_eq!(*a, p);
            }
        }
    }
});
