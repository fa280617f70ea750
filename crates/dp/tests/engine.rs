//! The forwarding engine driven single-threaded and deterministically: a [`Switch::manual`]
//! switch (no threads) on a clock the test moves, fed and drained through inject ports. No
//! test sleeps.

mod common;

use std::time::Duration;

use common::{frame, numbered, seq_of, Sim, BCAST, MAC_A, MAC_B, MAC_C};
use qswitch_api::{GenConfig, GenPortConfig, PlacementMode, PortConfig, PortKind, QosConfig};
use qswitch_dp::qos::QosUpdate;
use qswitch_dp::{Options, Switch};

const MS: u64 = 1_000_000;

/// Polls `n` times without moving the clock; frames received.
fn polls_at(sim: &Sim, n: usize) -> usize {
    (0..n).map(|_| sim.sw.poll_once(sim.now)).sum()
}

fn owner(sw: &Switch, queue: &str) -> Option<usize> {
    sw.stats()
        .workers
        .iter()
        .find(|w| w.queues.iter().any(|q| q == queue))
        .map(|w| w.id)
}

#[test]
fn a_burst_learns_before_it_forwards() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let c = sim.sw.add_inject_port("c", None).unwrap();
    sim.send(&b, &[frame(BCAST, MAC_B, 60)]);
    assert_eq!((a.take_captured().len(), c.take_captured().len()), (1, 1));
    // One burst of 3 on A: to B (known: unicast), to C (unknown: flood), and one from a
    // station behind A to A's address, which the first frame of this very burst taught the
    // switch (hairpin: dropped, not echoed).
    sim.send(
        &a,
        &[
            frame(MAC_B, MAC_A, 60),
            frame(MAC_C, MAC_A, 60),
            frame(MAC_A, MAC_C, 60),
        ],
    );
    assert_eq!(
        b.take_captured().len(),
        2,
        "unicast to B and the flood to C"
    );
    assert_eq!(c.take_captured().len(), 1, "only the flood");
    assert!(
        a.take_captured().is_empty(),
        "never back out of the ingress"
    );
    let st = sim.sw.stats();
    let a_st = st.ports.iter().find(|p| p.name == "a").unwrap();
    assert_eq!(a_st.rx_packets, 3);
    assert_eq!(a_st.drops.get("same_port"), Some(&1));
}

#[test]
fn frames_of_one_queue_keep_their_order_across_bursts() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    sim.send(&b, &[frame(BCAST, MAC_B, 60)]);
    a.take_captured();
    let frames: Vec<Vec<u8>> = (0..100).map(|i| numbered(MAC_B, MAC_A, i)).collect();
    for f in &frames {
        a.inject(f);
    }
    // 100 frames are four bursts of at most 32.
    assert_eq!(sim.step(1_000), 32);
    assert_eq!(sim.step(1_000), 32);
    sim.drain(&a);
    let got: Vec<u64> = b.take_captured().iter().map(|f| seq_of(f)).collect();
    assert_eq!(got, (0..100).collect::<Vec<_>>());
}

#[test]
fn learned_addresses_age_out_on_the_switch_clock() {
    let mut sim = Sim::with(
        1,
        Options {
            fdb_aging: Duration::from_secs(2),
            ..Options::default()
        },
    );
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let c = sim.sw.add_inject_port("c", None).unwrap();
    sim.send(&b, &[frame(BCAST, MAC_B, 60)]);
    a.take_captured();
    c.take_captured();
    sim.send(&a, &[frame(MAC_B, MAC_A, 60)]);
    assert_eq!((b.take_captured().len(), c.take_captured().len()), (1, 0));
    assert_eq!(sim.sw.fdb().len(), 2);
    // Three seconds later B is forgotten (housekeeping sweeps, lookups check the age):
    // frames to it flood again.
    sim.step(3_000 * MS);
    sim.send(&a, &[frame(MAC_B, MAC_A, 60)]);
    assert_eq!((b.take_captured().len(), c.take_captured().len()), (1, 1));
    let macs: Vec<String> = sim.sw.fdb().into_iter().map(|e| e.mac).collect();
    assert_eq!(macs, ["02:00:00:00:00:0a"], "only A, just relearned");
}

#[test]
fn removed_ports_are_forgotten_and_never_sent_to() {
    let mut sim = Sim::new(2);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let c = sim.sw.add_inject_port("c", None).unwrap();
    sim.send(&b, &[frame(BCAST, MAC_B, 60)]);
    sim.sw.del_port("b").unwrap();
    a.take_captured();
    c.take_captured();
    // B's address went with it: a frame to B floods to the ports that are left.
    sim.send(&a, &[frame(MAC_B, MAC_A, 60)]);
    assert_eq!(c.take_captured().len(), 1);
    assert!(b.take_captured().is_empty());
    // A port added in B's slot under B's name starts with nothing learned.
    let b2 = sim.sw.add_inject_port("b", None).unwrap();
    sim.send(&a, &[frame(MAC_B, MAC_A, 60)]);
    assert_eq!((b2.take_captured().len(), c.take_captured().len()), (1, 1));
}

/// A queue moves between workers at a burst boundary: the old worker's bursts are all sent
/// before the new worker's first, so nothing is lost or reordered, and the move is recorded.
#[test]
fn queue_hand_off_between_workers_at_a_burst_boundary() {
    let mut sim = Sim::with(
        2,
        Options {
            placement: PlacementMode::Static,
            ..Options::default()
        },
    );
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    sim.send(&b, &[frame(BCAST, MAC_B, 60)]);
    a.take_captured();
    let before = owner(&sim.sw, "a/0").expect("a/0 has a worker");
    let other = 1 - before;
    for i in 0..80 {
        a.inject(&numbered(MAC_B, MAC_A, i));
    }
    assert_eq!(sim.step(1_000), 32, "one burst on the old worker");
    sim.sw.pin("a", 0, Some(other)).unwrap();
    assert_eq!(owner(&sim.sw, "a/0"), Some(other));
    sim.drain(&a);
    let got: Vec<u64> = b.take_captured().iter().map(|f| seq_of(f)).collect();
    assert_eq!(got, (0..80).collect::<Vec<_>>());
    // The 48 frames after the move were transmitted by the new worker.
    let w = &sim.sw.stats().workers;
    assert!(w[other].queues.contains(&"a/0".to_string()));
    let p = sim.sw.placement();
    let m = p.moves.last().expect("the move is recorded");
    assert_eq!((m.port.as_str(), m.queue, m.to_cpu), ("a", 0, other));
    // Unpinned in static mode, it goes home again, still without loss.
    for i in 80..100 {
        a.inject(&numbered(MAC_B, MAC_A, i));
    }
    sim.sw.pin("a", 0, None).unwrap();
    assert_eq!(owner(&sim.sw, "a/0"), Some(before));
    sim.drain(&a);
    let got: Vec<u64> = b.take_captured().iter().map(|f| seq_of(f)).collect();
    assert_eq!(got, (80..100).collect::<Vec<_>>());
}

/// QoS admission at the engine: a port over its limit is not polled (back-pressure): its
/// frames wait, none is dropped, and each refill lets through what it pays for.
#[test]
fn qos_limit_holds_frames_back_without_dropping() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    sim.send(&b, &[frame(BCAST, MAC_B, 60)]);
    a.take_captured();
    // 8 Mbit/s = 1 MB/s = 1 byte per µs.
    sim.sw
        .qos_set(
            "a",
            &QosUpdate {
                max: Some(8_000_000),
                ..QosUpdate::default()
            },
        )
        .unwrap();
    sim.step(10 * MS); // an allocator tick publishes the limit
    let frames = 1_000u64;
    for i in 0..frames {
        let mut f = numbered(MAC_B, MAC_A, i);
        f.resize(1000, 0);
        a.inject(&f);
    }
    // Polled at one instant, the port gets through its bucket, then is held back.
    let first = polls_at(&sim, 1000);
    assert!(
        (100..400).contains(&first),
        "a full bucket (a few hundred kB) passes at once: {first}"
    );
    assert_eq!(a.pending() as u64, frames - first as u64, "the rest waits");
    // 100 ms later: about 100 kB more (100 frames of 1000 bytes), give or take a frame and
    // the refills of the allocator's ticks in between.
    let mut later = 0;
    for _ in 0..10 {
        later += sim.step(10 * MS) + polls_at(&sim, 100);
    }
    assert!(
        (95..=110).contains(&later),
        "{later} frames in 100 ms at 1 MB/s"
    );
    let st = sim.sw.stats();
    let a_st = st.ports.iter().find(|p| p.name == "a").unwrap();
    assert!(
        a_st.drops.is_empty(),
        "back-pressure, not drops: {:?}",
        a_st.drops
    );
    assert!(sim
        .sw
        .qos_show()
        .ports
        .iter()
        .any(|p| p.name == "a" && p.throttled > 0));
    // Lifting the limit lets the rest through, in order.
    sim.sw
        .qos_set(
            "a",
            &QosUpdate {
                clear: true,
                ..QosUpdate::default()
            },
        )
        .unwrap();
    sim.step(10 * MS);
    sim.drain(&a);
    let got: Vec<u64> = b.take_captured().iter().map(|f| seq_of(f)).collect();
    assert_eq!(got, (0..frames).collect::<Vec<_>>());
}

/// Admission control: guarantees toward an uplink never add up to more than reservable ×
/// capacity, whichever operation asks; a refused change changes nothing.
#[test]
fn qos_guarantees_are_admitted_up_to_the_reservable_share() {
    let sim = Sim::new(1);
    let sw = &sim.sw;
    let mut up = PortConfig::gen("up");
    up.capacity = Some("1G".parse().unwrap());
    sw.add_port(&up).unwrap();
    let with_min = |name: &str, min: &str| {
        let mut p = PortConfig::gen(name);
        p.qos = Some(QosConfig {
            min: Some(min.parse().unwrap()),
            ..QosConfig::default()
        });
        p
    };
    sw.add_port(&with_min("v1", "400M")).unwrap();
    sw.add_port(&with_min("v2", "400M")).unwrap();
    let err = sw.add_port(&with_min("v3", "200M")).unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    assert!(sw.ports().iter().all(|p| p.name != "v3"), "nothing changed");
    let up100 = QosUpdate {
        min: Some(100_000_000),
        ..QosUpdate::default()
    };
    sw.add_port(&PortConfig::gen("v4")).unwrap();
    sw.qos_set("v4", &up100).unwrap();
    let err = sw
        .qos_set(
            "v1",
            &QosUpdate {
                min: Some(500_000_000),
                ..QosUpdate::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    let mins: u64 = sw.qos_show().ports.iter().filter_map(|p| p.min).sum();
    assert_eq!(mins, 900_000_000);
}

/// A trunk uplink's capacity is shared by the ports of every VLAN it carries, tagged or
/// native, and by trunk ports that share one of them; a port in a VLAN it does not carry
/// has no claim on it. Admission counts the same ports, also when a policy change makes a
/// port carry more VLANs.
#[test]
fn a_trunk_uplink_admits_and_shares_among_the_ports_of_all_its_vlans() {
    let sim = Sim::new(1);
    let sw = &sim.sw;
    let mut up = PortConfig::gen("up");
    up.capacity = Some("1G".parse().unwrap());
    up.vlan = Some(5.try_into().unwrap());
    up.vlans = Some("10,20".parse().unwrap());
    sw.add_port(&up).unwrap();
    let port = |name: &str, vlan: u16, min: &str| {
        let mut p = PortConfig::gen(name);
        p.vlan = Some(vlan.try_into().unwrap());
        p.qos = Some(QosConfig {
            min: Some(min.parse().unwrap()),
            ..QosConfig::default()
        });
        p
    };
    sw.add_port(&port("native", 5, "300M")).unwrap();
    sw.add_port(&port("tagged10", 10, "300M")).unwrap();
    // VLAN 30 is not carried: its guarantee does not count toward the uplink.
    sw.add_port(&port("other", 30, "800M")).unwrap();
    let err = sw.add_port(&port("tagged20", 20, "400M")).unwrap_err();
    assert!(
        err.to_string().contains("refused") && err.to_string().contains("'up'"),
        "{err}"
    );
    sw.add_port(&port("tagged20", 20, "300M")).unwrap();
    let show = sw.qos_show();
    let uplink_of = |name: &str| {
        show.ports
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.uplink.clone())
    };
    for name in ["native", "tagged10", "tagged20"] {
        assert_eq!(uplink_of(name).as_deref(), Some("up"), "{name}");
    }
    assert_eq!(uplink_of("other"), None);
    // A trunk port of VLANs 20 and 30 is toward the uplink through VLAN 20.
    let mut vm = port("vgt", 30, "100M");
    vm.vlans = Some("20".parse().unwrap());
    let err = sw.add_port(&vm).unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    // Carrying VLAN 30 as well would put "other" (800M) behind the uplink: refused, and
    // the uplink's policy is left as it was.
    let err = sw
        .update_port_policy(
            "up",
            &qswitch_api::policy::PolicyUpdate {
                vlans: Some("10,20,30".parse().unwrap()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    assert_eq!(
        sw.port_policy("up").unwrap().vlans,
        "10,20".parse().unwrap()
    );
    assert_eq!(
        sw.qos_show()
            .ports
            .iter()
            .find(|p| p.name == "other")
            .unwrap()
            .uplink,
        None
    );
}

/// A trunk port toward two uplinks (each carries one of its VLANs) gets the smaller of its
/// two shares. Two uplinks may not carry a VLAN in common (as in the configuration file).
#[test]
fn a_trunk_port_toward_two_uplinks_gets_the_smaller_share() {
    let mut sim = Sim::new(1);
    let port = |name: &str, vlan: Option<u16>, vlans: Option<&str>| {
        let mut p = PortConfig::gen(name);
        p.vlan = vlan.map(|v| v.try_into().unwrap());
        p.vlans = vlans.map(|v| v.parse().unwrap());
        p
    };
    let uplink = |name: &str, cap: &str, vlan: u16, vlans: Option<&str>| {
        let mut p = port(name, Some(vlan), vlans);
        p.capacity = Some(cap.parse().unwrap());
        p
    };
    // The smaller uplink first: the larger one's share must not overwrite it.
    sim.sw.add_port(&uplink("up2", "500M", 20, None)).unwrap();
    sim.sw.add_port(&uplink("up1", "1G", 10, None)).unwrap();
    let err = sim
        .sw
        .add_port(&uplink("up3", "1G", 30, Some("10")))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("both be uplinks (capacity) of VLAN 10"),
        "{err}"
    );
    sim.sw.add_port(&port("only10", Some(10), None)).unwrap();
    sim.sw
        .add_port(&port("trunk", None, Some("10,20")))
        .unwrap();
    // Three allocator ticks. Idle ports claim a hundredth of an uplink's capacity each.
    sim.step(31_000_000);
    let show = sim.sw.qos_show();
    let alloc = |name: &str| {
        show.ports
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.alloc_bps)
    };
    assert_eq!(alloc("only10"), Some(10_000_000));
    assert_eq!(alloc("trunk"), Some(5_000_000), "up2's share, the smaller");
}

#[test]
fn a_switch_without_threads_does_not_move_by_itself() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    a.inject(&frame(BCAST, MAC_A, 60));
    std::thread::yield_now();
    assert_eq!(a.pending(), 1, "nothing polls but poll_once");
    assert_eq!(sim.sw.now(), 0);
    sim.step(5);
    assert_eq!((a.pending(), b.take_captured().len()), (0, 1));
    assert_eq!(sim.sw.now(), 5);
    // The clock never goes back.
    assert_eq!(sim.sw.poll_once(1), 0);
    assert_eq!(sim.sw.now(), 5);
    assert_eq!(sim.sw.failed(), None);
    // A started switch ignores poll_once.
    let cpu = qswitch_sys::thread::online_cpus().unwrap()[0];
    let started = Switch::start(&[cpu], &Options::default()).unwrap();
    assert_eq!(started.poll_once(1_000_000_000), 0);
    started.shutdown();
}

/// Gen ports on the engine: a two-queue generator spread over two workers, a sink; every
/// frame arrives once and in order per flow, on a clock that moves 1 µs per poll.
#[test]
fn generated_frames_all_arrive_in_order_without_threads() {
    let mut sim = Sim::new(2);
    let count = 20_000;
    let mut sink = PortConfig::gen("sink");
    sink.kind = PortKind::Gen(GenPortConfig {
        mac: Some("02:00:00:00:00:02".parse().unwrap()),
        generate: None,
    });
    let mut src = PortConfig::gen("src");
    src.queues = 2;
    src.kind = PortKind::Gen(GenPortConfig {
        mac: Some("02:00:00:00:00:01".parse().unwrap()),
        generate: Some(GenConfig {
            dst: "02:00:00:00:00:02".parse().unwrap(),
            size: 64,
            rate: 0,
            flows: 8,
            count,
            ip: None,
        }),
    });
    sim.sw.add_ports(&[sink, src]).unwrap();
    let received = |sim: &Sim| {
        let st = sim.sw.stats();
        let s = st.ports.iter().find(|p| p.name == "sink").unwrap();
        s.sink.clone().unwrap()
    };
    for _ in 0..10_000 {
        if received(&sim).received + received(&sim).lost >= count {
            break;
        }
        for _ in 0..100 {
            sim.step(1_000);
        }
    }
    let s = received(&sim);
    assert_eq!(
        (s.received, s.lost, s.reordered, s.foreign),
        (count, 0, 0, 0)
    );
}
