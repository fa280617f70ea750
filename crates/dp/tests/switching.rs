//! End-to-end switching through internal ports: no privileges needed.
//!
//! Gen ports generate and sink on a started switch (real threads, real clock); inject ports
//! feed hand-made (and malformed) frames to a switch with no threads ([`Switch::manual`]) and
//! capture what it sends them, deterministically and without sleeping. Every test bounds its
//! waits and stops its switch.

mod common;

use std::time::Duration;

use common::{frame, Sim, BCAST, MAC_A, MAC_B, MAC_C};
use qswitch_api::request::PortStats;
use qswitch_api::{GenConfig, GenPortConfig, PortConfig, PortKind};
use qswitch_dp::Switch;
use qswitch_wire::virtio_net_hdr::{VirtioNetHdr, GSO_TCPV4};

fn switch(workers: usize) -> Switch {
    let cpus = qswitch_sys::thread::online_cpus().unwrap();
    let cpus: Vec<usize> = cpus.iter().copied().cycle().take(workers).collect();
    Switch::start(&cpus, &qswitch_dp::Options::default()).unwrap()
}

fn gen_port(name: &str, mac: &str, gen: Option<GenConfig>, queues: u16) -> PortConfig {
    let mut p = PortConfig::gen(name);
    p.kind = PortKind::Gen(GenPortConfig {
        mac: Some(mac.parse().unwrap()),
        generate: gen,
    });
    p.queues = queues;
    p
}

fn port_stats(sw: &Switch, name: &str) -> PortStats {
    sw.stats()
        .ports
        .into_iter()
        .find(|p| p.name == name)
        .unwrap()
}

/// Polls `cond` until true or 10 s pass.
#[track_caller]
fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    qswitch_test_support::harness::wait_for(what, Duration::from_secs(10), cond)
}

#[test]
fn every_generated_frame_arrives_in_order() {
    for workers in [1, 2] {
        let sw = switch(workers);
        let count = 200_000;
        let g = GenConfig {
            dst: "02:00:00:00:00:02".parse().unwrap(),
            size: 64,
            rate: 0,
            flows: 8,
            count,
            ip: None,
        };
        sw.add_port(&gen_port("sink", "02:00:00:00:00:02", None, 1))
            .unwrap();
        sw.add_port(&gen_port("src", "02:00:00:00:00:01", Some(g), 2))
            .unwrap();
        wait_until("all frames at the sink", || {
            port_stats(&sw, "sink").sink.unwrap().received
                + port_stats(&sw, "sink").sink.unwrap().lost
                >= count
        });
        let s = port_stats(&sw, "sink").sink.unwrap();
        assert_eq!(
            (s.received, s.lost, s.reordered, s.foreign),
            (count, 0, 0, 0),
            "workers={workers}"
        );
        let src = port_stats(&sw, "src");
        assert_eq!(src.generated, Some(count));
        assert_eq!(src.rx_packets, count);
        assert!(src.drops.is_empty(), "{:?}", src.drops);
        sw.shutdown();
    }
}

#[test]
fn floods_unknown_then_learns() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let c = sim.sw.add_inject_port("c", None).unwrap();

    // Broadcast from A reaches B and C, never back to A.
    sim.send(&a, &[frame(BCAST, MAC_A, 60)]);
    assert_eq!(b.take_captured().len(), 1);
    assert_eq!(c.take_captured().len(), 1);
    assert!(a.take_captured().is_empty());

    // Unknown unicast to B floods; B answers; now A -> B is unicast only.
    sim.send(&a, &[frame(MAC_B, MAC_A, 60)]);
    assert_eq!((b.take_captured().len(), c.take_captured().len()), (1, 1));
    sim.send(&b, &[frame(MAC_A, MAC_B, 60)]);
    assert_eq!(
        (a.take_captured().len(), c.take_captured().len()),
        (1, 0),
        "A was learned"
    );
    sim.send(&a, &[frame(MAC_B, MAC_A, 60)]);
    assert_eq!(
        (b.take_captured().len(), c.take_captured().len()),
        (1, 0),
        "B was learned"
    );

    // Multicast floods.
    sim.send(&c, &[frame([0x01, 0, 0x5e, 0, 0, 1], MAC_C, 60)]);
    assert_eq!((a.take_captured().len(), b.take_captured().len()), (1, 1));

    let fdb = sim.sw.fdb();
    let macs: Vec<(&str, &str)> = fdb
        .iter()
        .map(|e| (e.mac.as_str(), e.port.as_str()))
        .collect();
    assert!(macs.contains(&("02:00:00:00:00:0a", "a")), "{macs:?}");
    assert!(macs.contains(&("02:00:00:00:00:0b", "b")), "{macs:?}");
    assert!(macs.contains(&("02:00:00:00:00:0c", "c")), "{macs:?}");

    // A station that moves is relearned.
    sim.send(&c, &[frame(BCAST, MAC_A, 60)]);
    a.take_captured();
    b.take_captured();
    sim.send(&b, &[frame(MAC_A, MAC_B, 60)]);
    assert_eq!(
        (a.take_captured().len(), c.take_captured().len()),
        (0, 1),
        "A moved to C"
    );
    sim.sw.shutdown();
}

#[test]
fn vlans_isolate() {
    let mut sim = Sim::new(1);
    let a10 = sim.sw.add_inject_port("a10", Some(10)).unwrap();
    let b10 = sim.sw.add_inject_port("b10", Some(10)).unwrap();
    let c20 = sim.sw.add_inject_port("c20", Some(20)).unwrap();
    let d0 = sim.sw.add_inject_port("d0", None).unwrap();
    sim.send(&a10, &[frame(BCAST, MAC_A, 60)]);
    assert_eq!(b10.take_captured().len(), 1);
    assert!(c20.take_captured().is_empty() && d0.take_captured().is_empty());
    // Same MAC in another VLAN is a different station.
    sim.send(&c20, &[frame(MAC_A, MAC_C, 60)]);
    assert!(
        a10.take_captured().is_empty()
            && b10.take_captured().is_empty()
            && d0.take_captured().is_empty()
    );
    sim.send(&d0, &[frame(MAC_A, MAC_B, 60)]);
    assert!(a10.take_captured().is_empty() && c20.take_captured().is_empty());
    sim.sw.shutdown();
}

#[test]
fn malformed_frames_are_counted_and_forwarding_goes_on() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let mut tagged = frame(BCAST, MAC_A, 64);
    tagged[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
    let bad_hdr = VirtioNetHdr {
        gso_type: GSO_TCPV4,
        gso_size: 0,
        ..Default::default()
    };
    a.inject_with_hdr(bad_hdr, &frame(BCAST, MAC_A, 60));
    sim.send(
        &a,
        &[
            vec![],
            vec![0xff; 13],
            frame(BCAST, [0x01, 0, 0, 0, 0, 1], 60),
            tagged,
            vec![0u8; 70_000],
            frame(BCAST, MAC_A, 60),
        ],
    );
    let st = port_stats(&sim.sw, "a");
    let d = |k: &str| st.drops.get(k).copied().unwrap_or(0);
    assert_eq!(d("runt"), 2, "{:?}", st.drops);
    assert_eq!(d("bad_src_mac"), 1);
    assert_eq!(d("vlan_tagged"), 1);
    assert_eq!(d("oversize"), 1);
    assert_eq!(d("bad_vnet_hdr"), 1);
    assert_eq!(b.take_captured().len(), 1, "the good frame still crossed");
    // Hairpin: a destination learned on the ingress port is dropped, not echoed.
    sim.send(&a, &[frame(MAC_A, [2, 0, 0, 0, 0, 0xee], 60)]);
    assert_eq!(port_stats(&sim.sw, "a").drops.get("same_port"), Some(&1));
    assert!(a.take_captured().is_empty());
    sim.sw.shutdown();
}

#[test]
fn offload_metadata_crosses_the_switch() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    // A 3000-byte "TSO" frame is forwarded whole.
    let hdr = VirtioNetHdr {
        gso_type: GSO_TCPV4,
        gso_size: 1448,
        hdr_len: 54,
        ..Default::default()
    };
    a.inject_with_hdr(hdr, &frame(BCAST, MAC_A, 3000));
    sim.send(&a, &[]);
    let got = b.take_captured();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].len(), 3000);
    sim.sw.shutdown();
}

#[test]
fn ports_come_and_go_without_disturbing_traffic() {
    let sw = switch(2);
    let g = GenConfig {
        dst: "02:00:00:00:00:02".parse().unwrap(),
        size: 64,
        rate: 200_000,
        flows: 4,
        count: 0,
        ip: None,
    };
    sw.add_port(&gen_port("sink", "02:00:00:00:00:02", None, 1))
        .unwrap();
    sw.add_port(&gen_port("src", "02:00:00:00:00:01", Some(g), 1))
        .unwrap();
    // Let the sink's MAC be learned (it never sends, so frames flood until then; that's fine).
    for i in 0..20 {
        let name = format!("tmp{i}");
        sw.add_port(&gen_port(&name, "02:00:00:00:01:00", None, 2))
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        sw.del_port(&name).unwrap();
    }
    let s = port_stats(&sw, "sink").sink.unwrap();
    assert!(s.received > 0);
    assert_eq!((s.lost, s.reordered), (0, 0), "{s:?}");
    assert!(sw.del_port("nope").is_err());
    assert!(
        sw.add_port(&gen_port("sink", "02:00:00:00:00:09", None, 1))
            .is_err(),
        "duplicate name"
    );
    sw.shutdown();
}

/// A thread that panics stops the switch, and the switch says which thread and why, for the
/// daemon to report before it exits non-zero.
#[test]
fn a_panicking_worker_stops_the_switch_with_a_message() {
    let sw = switch(1);
    let a = sw.add_inject_port("a", None).unwrap();
    assert_eq!(sw.failed(), None);
    assert_eq!(sw.wait_failed(Some(Duration::from_millis(1))), None);
    a.panic_on_next_rx();
    a.inject(&frame(BCAST, MAC_A, 60));
    sw.kick();
    let why = sw
        .wait_failed(Some(Duration::from_secs(10)))
        .expect("the failure is reported");
    assert!(why.contains("qs-worker-0"), "{why}");
    assert!(why.contains("rx panic requested by the test"), "{why}");
    assert!(sw.stopping());
    assert_eq!(sw.failed().as_deref(), Some(why.as_str()));
    sw.shutdown();
}

/// Issue 27 F6: at start, a veth or afxdp port whose interface does not exist waits for it
/// (listed, no queue, nothing switched) and keeps no other port from starting; its name and
/// interface stay taken; `port del` removes it. A live `add_port` of it is still refused.
#[test]
fn a_port_whose_interface_is_missing_waits_and_others_start() {
    let sw = switch(1);
    let text = "[[port]]\nname = \"x\"\ntype = \"veth\"\nifname = \"qsnothere0\"\n\
                [[port]]\nname = \"y\"\ntype = \"afxdp\"\nifname = \"qsnothere1\"\n";
    let mut ports = qswitch_api::Config::from_toml(text).unwrap().ports;
    assert!(sw.add_port(&ports[0]).is_err(), "a live add still fails");
    ports.push(gen_port("a", "02:00:00:00:00:0a", None, 1));
    let waiting = sw.add_ports_or_wait(&ports).unwrap();
    assert_eq!(waiting, ["x", "y"]);
    let list = sw.ports();
    let x = list.iter().find(|p| p.name == "x").unwrap();
    assert_eq!(x.waiting.as_deref(), Some("qsnothere0"));
    assert!(x.queues.is_empty());
    let a = list.iter().find(|p| p.name == "a").unwrap();
    assert!(a.waiting.is_none());
    assert_eq!(
        sw.port_configs().len(),
        3,
        "waiting ports stay in the config"
    );
    // Their names and interfaces are taken.
    assert!(sw
        .add_port(&gen_port("x", "02:00:00:00:00:0b", None, 1))
        .is_err());
    let mut other = ports[1].clone();
    other.name = "z".to_string();
    let e = sw.add_port(&other).unwrap_err().to_string();
    assert!(e.contains("qsnothere1"), "{e}");
    // Still missing: nothing opens.
    assert_eq!(sw.attach_waiting(), 2);
    sw.del_port("x").unwrap();
    assert!(sw.ports().iter().all(|p| p.name != "x"));
    assert_eq!(sw.attach_waiting(), 1);
    sw.shutdown();
}
