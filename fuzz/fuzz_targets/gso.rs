//! The GSO path: an arbitrary virtio-net header and frame, as a guest's transmit queue
//! carries them. `VirtioNetHdr::validate` must refuse what segmentation cannot handle
//! safely (the switch drops those as `bad_vnet_hdr`); what it accepts is segmented with
//! `segment_while`, which must stop when the destination is full (`emit` returning false)
//! and never emit a segment longer than its headers plus one MSS.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_wire::gso;
use qswitch_wire::virtio_net_hdr::{self, VirtioNetHdr, MIN_GSO_SIZE};

fuzz_target!(|data: &[u8]| {
    if data.len() < virtio_net_hdr::LEN + 1 {
        return;
    }
    let Ok(hdr) = VirtioNetHdr::parse(&data[..virtio_net_hdr::LEN]) else {
        return;
    };
    // Room in the destination, in segments (0 = full at once).
    let room = u32::from(data[virtio_net_hdr::LEN]);
    let frame = &data[virtio_net_hdr::LEN + 1..];
    if hdr.validate(frame.len()).is_err() {
        return;
    }
    let _ = hdr.wire_frames(frame);
    if !hdr.is_gso() {
        return;
    }
    assert!(hdr.gso_size >= MIN_GSO_SIZE);
    let mut scratch = vec![0u8; 64 * 1024 + 256];
    let mut emitted = 0u32;
    let mut longest = 0usize;
    let result = gso::segment_while(frame, &hdr, &mut scratch, |seg| {
        emitted += 1;
        longest = longest.max(seg.len());
        emitted < room
    });
    if let Ok(n) = result {
        assert_eq!(n, emitted);
        assert!(n <= room.max(1), "segmenting went on after the destination was full");
        // Ethernet + VLAN + IPv6 with extensions or IPv4 with options + TCP with options,
        // bounded by the frame; then one MSS.
        assert!(longest <= frame.len().min(usize::from(hdr.gso_size) + frame.len()));
    }
});
