//! Every parser a frame from a guest or a TAP meets: L2 classification, flow keys, the
//! virtio-net header, partial-checksum completion and software TSO segmentation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_wire::virtio_net_hdr::VirtioNetHdr;
use qswitch_wire::{checksum, flow, gso, l2};

fuzz_target!(|data: &[u8]| {
    let _ = l2::classify(data);
    let _ = flow::extract(data);
    if data.len() < 12 {
        return;
    }
    let (h, frame) = data.split_at(12);
    if let Ok(hdr) = VirtioNetHdr::parse(h) {
        if hdr.validate(frame.len()).is_ok() {
            let _ = hdr.wire_frames(frame);
            let mut scratch = vec![0u8; 70_000];
            let _ = gso::segment(frame, &hdr, &mut scratch, |_| {});
            let mut f = frame.to_vec();
            let _ = checksum::complete_partial(&mut f, usize::from(hdr.csum_start), usize::from(hdr.csum_offset));
        }
    }
});
