//! The data-path side of flow export on the manual engine: with a tap published, every
//! forwarded frame reaches the worker's flow cache (with its ingress and egress port and
//! VLAN) and the sFlow sampler; off, nothing does; records ended by the cache wait in the
//! worker's slot for the exporter.

mod common;

use common::{Sim, MAC_A, MAC_B};
use qswitch_dp::export::{CacheConfig, TapConfig};
use qswitch_test_support::frames::{ipv4_frame, udp_datagram};

fn udp(src: [u8; 6], dst: [u8; 6], id: u16) -> Vec<u8> {
    ipv4_frame(
        dst,
        src,
        17,
        id,
        udp_datagram(4000, 5000, &[7u8; 100]),
        false,
    )
}

#[test]
fn forwarded_frames_feed_the_cache_and_sampler_only_while_on() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    // b's address learned, so a's frames go to b only.
    sim.send(&b, &[udp(MAC_B, MAC_A, 0)]);
    let _ = a.take_captured();
    assert!(sim.sw.export_tap().is_none());
    let cfg = TapConfig {
        ipfix: Some(CacheConfig {
            capacity: 64,
            sampling: 1,
            active_timeout_ms: 60_000,
            idle_timeout_ms: 15_000,
        }),
        sflow: Some(1),
    };
    assert!(sim.sw.set_export(Some(cfg)).is_none());
    let frames: Vec<Vec<u8>> = (0..10).map(|i| udp(MAC_A, MAC_B, i)).collect();
    sim.send(&a, &frames);
    assert_eq!(b.take_captured().len(), 10, "forwarding unchanged");
    let tap = sim.sw.export_tap().expect("on");
    {
        let mut slot = tap.slots()[0].lock();
        let st = slot.cache_stats();
        assert_eq!((st.frames, st.sampled, st.flows), (10, 10, 1));
        assert_eq!(slot.samples.len(), 10, "sFlow 1 in 1");
        let s = &slot.samples[9];
        assert_eq!((s.input, s.output, s.rate, s.pool), (1, 2, 1, 10));
        assert_eq!(s.frame_len as usize, frames[9].len());
        assert_eq!(&s.header[..s.header_len as usize], &frames[9][..128]);
        // The exporter flushes: one record with both ports, every frame and byte.
        let mut out = Vec::new();
        slot.cache.as_mut().unwrap().flush(&mut out);
        assert_eq!(out.len(), 1);
        let r = out[0];
        assert_eq!((r.key.ingress, r.key.egress, r.key.vlan), (1, 2, None));
        assert_eq!((r.packets, r.octets), (10, 10 * (20 + 8 + 100)));
        slot.samples.clear();
    }
    // Off: the old tap comes back and is fed no more.
    let old = sim.sw.set_export(None).expect("the tap that was on");
    sim.send(&a, &frames);
    assert_eq!(b.take_captured().len(), 10);
    assert_eq!(old.slots()[0].lock().cache_stats().frames, 10);
    assert!(old.slots()[0].lock().samples.is_empty());
}

#[test]
fn a_full_pending_list_drops_and_counts_in_the_slot() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    sim.send(&b, &[udp(MAC_B, MAC_A, 0)]);
    sim.sw.set_export(Some(TapConfig {
        ipfix: None,
        sflow: Some(1),
    }));
    let max = qswitch_dp::export::tap::MAX_PENDING_SAMPLES;
    let frames: Vec<Vec<u8>> = (0..32).map(|i| udp(MAC_A, MAC_B, i)).collect();
    for _ in 0..(max / 32 + 2) {
        sim.send(&a, &frames);
    }
    let tap = sim.sw.export_tap().unwrap();
    let slot = tap.slots()[0].lock();
    assert_eq!(slot.samples.len(), max);
    assert_eq!(slot.dropped_samples, 64);
    assert_eq!(
        slot.samples.capacity(),
        max,
        "no growth on the worker's side"
    );
}
