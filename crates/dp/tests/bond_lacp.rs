//! LACP against a real partner (root): Open vSwitch's userspace datapath
//! (`datapath_type=netdev`, no kernel module) in a namespace this test creates, with its own
//! ovsdb and run directory in the test's temp dir, bonding `p0` and `p1`
//! (`bond_mode=balance-tcp lacp=active|passive other_config:lacp-time=fast`). The other ends
//! of the two veth pairs stay in the test's namespace, where a small loop drives
//! `qswitch_dp::port::bond::lacp` over AF_PACKET sockets, as the bond port's driver will.
//!
//! - active against active, and passive against active: `ovs-appctl lacp/show` reports both
//!   members current with this side as a partner in sync, collecting and distributing, and
//!   this side distributes on both members;
//! - passive against passive: nobody sends a LACPDU and nothing forms;
//! - a silent partner (ovs-vswitchd stopped with SIGSTOP) is detected within 3 s at the fast
//!   rate; the measured time is printed.
//!
//! OVS 3.1's userspace bond sends no LACPDU on a member until it has seen its carrier change,
//! so this side's veth ends are brought up only after the bond exists (as a cable plugged in).
//! Everything is stopped by PID and removed on drop, also when an assertion fails.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use qswitch_dp::port::bond::lacp::{Config, Lacp, Mode, Rate, RxState};
use qswitch_sys::packet::{PacketOptions, PacketSocket};
use qswitch_test_support::harness::{signal, LinkGuard};
use qswitch_test_support::ovs::{ovs_or_skip, Ovs};
use qswitch_test_support::{root_or_skip, sh_ok, wait_until};
use qswitch_wire::lacp::Lacpdu;
use qswitch_wire::MacAddr;

const WAIT: Duration = Duration::from_secs(20);
const SYSTEM: MacAddr = MacAddr([0x02, 0x51, 0x53, 0x00, 0x00, 0x01]);

/// This side: the LACP machine of two members, driven over AF_PACKET by a thread.
struct Side {
    lacp: Arc<Mutex<Lacp>>,
    stop: Arc<AtomicBool>,
    /// LACPDUs sent and received.
    sent: Arc<AtomicUsize>,
    received: Arc<AtomicUsize>,
    /// When the last LACPDU arrived, and when the machine last went from some member
    /// current to none (its own time, not the test's observation of it).
    last_rx: Arc<Mutex<Option<Instant>>>,
    lost_at: Arc<Mutex<Option<Instant>>>,
    thread: Option<JoinHandle<()>>,
}

fn ifindex(name: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
        .expect("ifindex")
        .trim()
        .parse()
        .expect("ifindex")
}

fn mac_of(name: &str) -> MacAddr {
    std::fs::read_to_string(format!("/sys/class/net/{name}/address"))
        .expect("address")
        .trim()
        .parse()
        .expect("mac")
}

impl Side {
    /// Opens the sockets, brings the links up and starts the loop.
    fn start(ifnames: &[String], mode: Mode) -> Side {
        let mut lacp = Lacp::new(Config {
            mode,
            rate: Rate::Fast,
            system_priority: 32768,
            system: SYSTEM,
            key: 17,
        });
        let opts = PacketOptions {
            slot_size: 2048,
            slots: 64,
            promisc: false,
        };
        let mut socks = Vec::new();
        let mut macs = Vec::new();
        let now = Instant::now();
        for (i, name) in ifnames.iter().enumerate() {
            socks.push(PacketSocket::open(ifindex(name), opts).expect("AF_PACKET socket"));
            macs.push(mac_of(name));
            let m = lacp.add_member(i as u16 + 1, 32768);
            sh_ok(&["ip", "link", "set", "dev", name, "up"]);
            lacp.set_link(m, true, now);
        }
        let lacp = Arc::new(Mutex::new(lacp));
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(AtomicUsize::new(0));
        let last_rx = Arc::new(Mutex::new(None));
        let lost_at = Arc::new(Mutex::new(None));
        let thread = {
            let (lacp, stop, sent, received, last_rx, lost_at) = (
                lacp.clone(),
                stop.clone(),
                sent.clone(),
                received.clone(),
                last_rx.clone(),
                lost_at.clone(),
            );
            let current = |l: &Lacp| {
                (0..l.len()).any(|m| l.status(m).is_some_and(|s| s.rx == RxState::Current))
            };
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut pdus = Vec::new();
                    for (m, s) in socks.iter_mut().enumerate() {
                        s.rx.recv(32, |f| {
                            if let Ok((_, pdu)) = Lacpdu::parse_frame(f.data) {
                                pdus.push((m, pdu));
                            }
                        });
                    }
                    let now = Instant::now();
                    let mut out = Vec::new();
                    {
                        let mut l = lacp.lock().unwrap();
                        received.fetch_add(pdus.len(), Ordering::Relaxed);
                        if !pdus.is_empty() {
                            *last_rx.lock().unwrap() = Some(now);
                        }
                        for (m, pdu) in &pdus {
                            l.receive(*m, pdu, now);
                        }
                        let was = current(&l);
                        l.poll(now, |m, pdu| out.push((m, pdu.frame(macs[m]))));
                        if was && !current(&l) {
                            *lost_at.lock().unwrap() = Some(now);
                        }
                    }
                    for (m, frame) in &out {
                        if socks[*m].tx.send(&[&frame[..]]).is_ok() {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Side {
            lacp,
            stop,
            sent,
            received,
            last_rx,
            lost_at,
            thread: Some(thread),
        }
    }

    fn distributing(&self) -> bool {
        let l = self.lacp.lock().unwrap();
        (0..l.len()).all(|m| l.distributing(m))
    }

    fn any_current(&self) -> bool {
        let l = self.lacp.lock().unwrap();
        (0..l.len()).any(|m| l.status(m).is_some_and(|s| s.rx == RxState::Current))
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn forms(tag: &str, ours: Mode, theirs: &str) -> Option<(Ovs, Side)> {
    if !ovs_or_skip() {
        return None;
    }
    let ovs = Ovs::start(tag, theirs);
    let side = Side::start(&ovs.ours, ours);
    let ok = wait_until(WAIT, || side.distributing() && ovs.formed_with(SYSTEM));
    assert!(
        ok,
        "LACP did not form ({ours:?} against {theirs}); ours: {:?} {:?}\n{}\n{}",
        side.lacp.lock().unwrap().status(0),
        side.lacp.lock().unwrap().status(1),
        ovs.appctl(&["lacp/show", "bond0"]),
        ovs.log()
    );
    let bond = ovs.appctl(&["bond/show", "bond0"]);
    assert!(bond.contains("lacp_status: negotiated"), "{bond}");
    Some((ovs, side))
}

#[test]
fn active_against_active_ovs_forms_and_a_silent_partner_is_detected() {
    let Some((ovs, side)) = forms("aa", Mode::Active, "active") else {
        return;
    };
    // Silence: ovs-vswitchd stopped (its links stay up).
    let pid = ovs.vswitchd.pid();
    signal(pid, "STOP");
    let stopped = Instant::now();
    let detected = wait_until(Duration::from_secs(6), || !side.any_current());
    signal(pid, "CONT");
    assert!(detected, "a silent partner was not detected in 6 s");
    let at = side
        .lost_at
        .lock()
        .unwrap()
        .expect("the loop saw the members expire");
    let last = side.last_rx.lock().unwrap().expect("a LACPDU was received");
    let took = at.saturating_duration_since(stopped);
    println!(
        "silent partner detected {} ms after it stopped, {} ms after its last LACPDU (fast rate)",
        took.as_millis(),
        (at - last).as_millis()
    );
    // The information expires 3 s after the last LACPDU, which came before the partner
    // stopped; the margin is the loop's period (5 ms) and its scheduling on a loaded machine.
    assert!(
        at - last <= Duration::from_millis(3_100),
        "took {:?}",
        at - last
    );
    assert!(took <= Duration::from_millis(3_100), "took {took:?}");
    assert!(!side.distributing());
    // It speaks again: the bond forms again.
    assert!(
        wait_until(WAIT, || side.distributing() && ovs.formed_with(SYSTEM)),
        "did not form again"
    );
}

#[test]
fn passive_against_active_ovs_forms() {
    let _ = forms("pa", Mode::Passive, "active");
}

#[test]
fn active_against_passive_ovs_forms() {
    let _ = forms("ap", Mode::Active, "passive");
}

#[test]
fn passive_against_passive_ovs_never_forms() {
    if !ovs_or_skip() {
        return;
    }
    let ovs = Ovs::start("pp", "passive");
    let side = Side::start(&ovs.ours, Mode::Passive);
    // Nothing can happen, so there is no event to wait for: watch for 3 fast timeouts.
    let start = Instant::now();
    let formed = wait_until(Duration::from_secs(4), || {
        side.any_current() || side.received.load(Ordering::Relaxed) > 0
    });
    assert!(!formed, "passive sides talked after {:?}", start.elapsed());
    assert_eq!(
        side.sent.load(Ordering::Relaxed),
        0,
        "a passive side sent LACPDUs"
    );
    let show = ovs.appctl(&["lacp/show", "bond0"]);
    assert!(!show.contains("current"), "{show}");
    assert!(!ovs.formed_with(SYSTEM));
}

// ---- The bond port (`type = "bond"`) of a running switch against Open vSwitch ----

use common::packet_bond;
use qswitch_api::bond::BondInfo;
use qswitch_api::{BondConfig, BondMember, BondMode, GenConfig, GenPortConfig, LacpMode, LacpRate};
use qswitch_api::{PortConfig, PortKind};
use qswitch_dp::{Options, Switch};

/// A started switch with a bond of `ours` (AF_PACKET members), balance-tcp, LACP `lacp` at
/// the fast rate, and a gen port sending `flows` UDP flows to an unknown MAC (flooded to the
/// bond) at 2000 frames/s.
fn switch_with_bond(ours: &[String], lacp: LacpMode, flows: u16) -> Switch {
    let cpu = qswitch_sys::thread::online_cpus().unwrap()[0];
    let sw = Switch::start(&[cpu], &Options::default()).expect("switch");
    for name in ours {
        sh_ok(&["ip", "link", "set", "dev", name, "up"]);
    }
    let bond = packet_bond("uplink", BondMode::BalanceTcp, lacp, LacpRate::Fast, ours);
    sw.add_port(&bond).expect("bond port");
    let mut src = PortConfig::gen("src");
    src.kind = PortKind::Gen(GenPortConfig {
        mac: Some("02:00:00:00:00:01".parse().unwrap()),
        generate: Some(GenConfig {
            dst: "02:00:00:00:00:99".parse().unwrap(),
            size: 64,
            rate: 2000,
            flows,
            count: 0,
            ip: None,
        }),
    });
    sw.add_port(&src).expect("gen port");
    sw
}

fn bond_info(sw: &Switch) -> BondInfo {
    sw.bonds(Some("uplink")).expect("bond show").remove(0)
}

fn all_distributing(b: &BondInfo) -> bool {
    b.members.iter().all(|m| {
        m.enabled
            && m.lacp_state
                .as_ref()
                .is_some_and(|l| l.distributing() && l.partner_in_sync)
    })
}

/// Frames each member sent while `f` ran.
fn tx_during(sw: &Switch, f: impl FnOnce()) -> Vec<u64> {
    let before: Vec<u64> = bond_info(sw).members.iter().map(|m| m.tx_packets).collect();
    f();
    bond_info(sw)
        .members
        .iter()
        .zip(before)
        .map(|(m, b)| m.tx_packets - b)
        .collect()
}

#[test]
fn bond_port_balance_tcp_against_ovs_spreads_flows_and_survives_a_member() {
    if !ovs_or_skip() {
        return;
    }
    let ovs = Ovs::start("bt", "active");
    let sw = switch_with_bond(&ovs.ours, LacpMode::Active, 64);
    let system = mac_of(&ovs.ours[0]);
    let formed = wait_until(WAIT, || {
        all_distributing(&bond_info(&sw)) && ovs.formed_with(system)
    });
    assert!(
        formed,
        "the bond port did not form: {:#?}\n{}\n{}",
        bond_info(&sw),
        ovs.appctl(&["lacp/show", "bond0"]),
        ovs.log()
    );
    let show = ovs.appctl(&["bond/show", "bond0"]);
    assert!(show.contains("lacp_status: negotiated"), "{show}");
    // 64 flows: each member carries at least a quarter.
    let sent = tx_during(&sw, || {
        let t = Instant::now();
        wait_until(Duration::from_secs(10), || {
            bond_info(&sw)
                .members
                .iter()
                .map(|m| m.tx_packets)
                .sum::<u64>()
                > 0
                && t.elapsed() > Duration::from_secs(1)
        });
    });
    let total: u64 = sent.iter().sum();
    println!("64 flows over the two members: {sent:?} frames");
    assert!(total > 200, "too little traffic: {sent:?}");
    for s in &sent {
        assert!(*s * 4 >= total, "a member carried under 25 %: {sent:?}");
    }
    // Member 0's link goes down: traffic continues on member 1 alone.
    sh_ok(&["ip", "link", "set", "dev", &ovs.ours[0], "down"]);
    assert!(
        wait_until(WAIT, || !bond_info(&sw).members[0].enabled),
        "member 0 still enabled: {:#?}",
        bond_info(&sw)
    );
    let sent = tx_during(&sw, || std::thread::sleep(Duration::from_millis(500)));
    println!("member 0 down: {sent:?} frames");
    assert_eq!(sent[0], 0, "{sent:?}");
    assert!(
        sent[1] > 400,
        "traffic did not continue on member 1: {sent:?}"
    );
    // It comes back and rejoins.
    sh_ok(&["ip", "link", "set", "dev", &ovs.ours[0], "up"]);
    assert!(
        wait_until(WAIT, || all_distributing(&bond_info(&sw))
            && ovs.formed_with(system)),
        "member 0 did not rejoin: {:#?}",
        bond_info(&sw)
    );
    let sent = tx_during(&sw, || std::thread::sleep(Duration::from_millis(500)));
    println!("member 0 back: {sent:?} frames");
    assert!(sent.iter().all(|&s| s > 0), "{sent:?}");
    sw.shutdown();
}

#[test]
fn bond_port_passive_forms_with_active_ovs() {
    if !ovs_or_skip() {
        return;
    }
    let ovs = Ovs::start("bp", "active");
    let sw = switch_with_bond(&ovs.ours, LacpMode::Passive, 1);
    let system = mac_of(&ovs.ours[0]);
    assert!(
        wait_until(WAIT, || all_distributing(&bond_info(&sw))
            && ovs.formed_with(system)),
        "passive bond port did not form: {:#?}\n{}",
        bond_info(&sw),
        ovs.appctl(&["lacp/show", "bond0"])
    );
    sw.shutdown();
}

#[test]
fn bond_port_passive_never_forms_with_passive_ovs() {
    if !ovs_or_skip() {
        return;
    }
    let ovs = Ovs::start("bq", "passive");
    let sw = switch_with_bond(&ovs.ours, LacpMode::Passive, 1);
    // Nothing can happen: watch for more than 3 fast timeouts.
    let talked = wait_until(Duration::from_secs(4), || {
        bond_info(&sw)
            .members
            .iter()
            .any(|m| m.enabled || m.lacp_rx > 0 || m.lacp_tx > 0)
    });
    assert!(!talked, "passive sides talked: {:#?}", bond_info(&sw));
    let show = ovs.appctl(&["lacp/show", "bond0"]);
    assert!(!show.contains("current"), "{show}");
    // Nothing is distributed: the generated frames are counted as link_down.
    assert!(bond_info(&sw).members.iter().all(|m| m.tx_packets == 0));
    sw.shutdown();
}

#[test]
fn bond_port_bad_members_are_refused_and_change_nothing() {
    if !root_or_skip() {
        return;
    }
    let cpu = qswitch_sys::thread::online_cpus().unwrap()[0];
    let sw = Switch::start(&[cpu], &Options::default()).expect("switch");
    let pid = std::process::id() % 100_000;
    let (a, missing) = (format!("qbm{pid}a"), format!("qbm{pid}x"));
    sh_ok(&["ip", "tuntap", "add", "dev", &a, "mode", "tap"]);
    let _link = LinkGuard(a.clone());
    let bond = |members: &[&str]| {
        PortConfig::new(
            "b",
            PortKind::Bond(BondConfig {
                mode: BondMode::ActiveBackup,
                lacp: LacpMode::Off,
                lacp_rate: LacpRate::Slow,
                members: members
                    .iter()
                    .map(|i| BondMember {
                        kind: qswitch_api::PortType::Tap,
                        ifname: i.parse().unwrap(),
                        mode: None,
                        queues: None,
                        fastpath: None,
                    })
                    .collect(),
                updelay: 0,
                downdelay: 0,
                lacp_fallback: false,
            }),
        )
    };
    let e = sw.add_port(&bond(&[&a, &missing])).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("port 'b': member interface '{missing}' does not exist")
    );
    sw.add_port(&PortConfig::tap("t", a.parse().unwrap()))
        .unwrap();
    let e = sw.add_port(&bond(&[&a])).unwrap_err().to_string();
    assert!(e.contains(&a) && e.contains("'t'"), "{e}");
    assert!(!e.contains('\n'));
    let names: Vec<String> = sw.ports().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["t"], "nothing changed");
    sw.shutdown();
}
