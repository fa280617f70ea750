//! The firewall in the switch: which ports it filters, driven single-threaded on a
//! [`Switch::manual`] switch through inject ports (see `common`).

mod common;

use common::Sim;
use qswitch_api::config::Config;
use qswitch_api::PortConfig;
use qswitch_dp::Options;

/// A config's `[[security_group]]` tables and `[firewall]` as switch options, and its ports.
fn options(toml: &str) -> (Options, Vec<PortConfig>) {
    let c = Config::from_toml(toml).expect("config");
    let options = Options {
        firewall: c.firewall,
        security_groups: c.security_groups.clone(),
        ..Options::default()
    };
    (options, c.ports)
}

const GROUPS: &str = r#"
[switch]
workers = "0"

[[security_group]]
name = "web"
rules = [{ direction = "ingress", protocol = "tcp", ports = "80" }, { direction = "egress" }]

[[port]]
name = "vm"
type = "gen"
security_groups = ["web"]

[[port]]
name = "out"
type = "gen"
"#;

#[test]
fn the_switch_holds_the_firewall_and_knows_its_filtered_ports() {
    let (options, ports) = options(GROUPS);
    let sim = Sim::with(1, options);
    let fw = sim.sw.firewall().clone();
    assert!(!fw.active(), "no port with groups yet: no table");
    sim.sw.add_inject_port_config(&ports[0]).unwrap();
    sim.sw.add_inject_port_config(&ports[1]).unwrap();
    assert!(fw.filtered(0), "vm has groups");
    assert!(!fw.filtered(1), "out has none");
    assert!(fw.active());
    assert_eq!(
        fw.rules()
            .name(fw.rules().ports[0].as_ref().unwrap().ingress[0].id),
        "web/0"
    );
    sim.sw.del_port("vm").unwrap();
    assert!(!fw.filtered(0), "a removed port is not filtered");
}

#[test]
fn a_switch_without_groups_has_an_empty_firewall() {
    let sim = Sim::new(1);
    sim.sw.add_inject_port("a", None).unwrap();
    let fw = sim.sw.firewall();
    assert!(!fw.filtered(0));
    assert!(!fw.active(), "no table is allocated");
    assert!(fw.rules().ports.iter().all(Option::is_none));
}

const VM: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const OUT: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
const VM_IP: [u8; 4] = [10, 0, 0, 1];
const OUT_IP: [u8; 4] = [10, 0, 0, 2];
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// An IPv4 TCP segment from `src` to `dst` (MAC, IP, port).
/// The acknowledgement is `seq`'s peer's: tests open with seq 1000 on one side and 5000 on
/// the other.
fn tcp(dst: ([u8; 6], [u8; 4], u16), src: ([u8; 6], [u8; 4], u16), flags: u8, seq: u32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 40, 0, 1, 0, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src.1);
    f.extend_from_slice(&dst.1);
    f.extend_from_slice(&src.2.to_be_bytes());
    f.extend_from_slice(&dst.2.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    let ack: u32 = match (flags & ACK != 0, seq) {
        (false, _) => 0,
        (true, 5000) => 1001,
        (true, _) => 5001,
    };
    f.extend_from_slice(&ack.to_be_bytes());
    f.extend_from_slice(&[5 << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(60, 0);
    f
}

fn drops(sim: &Sim, port: &str, reason: &str) -> u64 {
    let st = sim.sw.stats();
    let p = st.ports.iter().find(|p| p.name == port).unwrap();
    p.drops.get(reason).copied().unwrap_or(0)
}

#[test]
fn ingress_default_deny_an_allowed_port_opens_and_replies_pass() {
    let (options, ports) = options(GROUPS);
    let mut sim = Sim::with(1, options);
    let vm = sim.sw.add_inject_port_config(&ports[0]).unwrap();
    let out = sim.sw.add_inject_port_config(&ports[1]).unwrap();
    // Port 22: no rule lets it in (the frame is flooded: the destination is unknown).
    sim.send(
        &out,
        &[tcp((VM, VM_IP, 22), (OUT, OUT_IP, 40000), SYN, 1000)],
    );
    assert!(vm.take_captured().is_empty(), "denied");
    assert_eq!(drops(&sim, "vm", "fw_denied_ingress"), 1);
    // Port 80 opens, and its SYN-ACK goes back out.
    sim.send(
        &out,
        &[tcp((VM, VM_IP, 80), (OUT, OUT_IP, 40001), SYN, 1000)],
    );
    assert_eq!(vm.take_captured().len(), 1, "allowed by web/0");
    sim.send(
        &vm,
        &[tcp((OUT, OUT_IP, 40001), (VM, VM_IP, 80), SYN | ACK, 5000)],
    );
    assert_eq!(out.take_captured().len(), 1, "the reply");
    assert_eq!(sim.sw.firewall().sessions(0), 1);
    // An ACK to port 80 with no connection: invalid.
    sim.send(
        &out,
        &[tcp((VM, VM_IP, 80), (OUT, OUT_IP, 40002), ACK, 1000)],
    );
    assert!(vm.take_captured().is_empty());
    assert_eq!(drops(&sim, "vm", "ct_invalid"), 1);
    // A connection the VM opens (egress: everything) has its replies let in.
    sim.send(
        &vm,
        &[tcp((OUT, OUT_IP, 443), (VM, VM_IP, 50000), SYN, 1000)],
    );
    assert_eq!(out.take_captured().len(), 1);
    sim.send(
        &out,
        &[tcp((VM, VM_IP, 50000), (OUT, OUT_IP, 443), SYN | ACK, 5000)],
    );
    assert_eq!(
        vm.take_captured().len(),
        1,
        "the reply to an egress connection"
    );
    // The unfiltered port's frames among themselves and ARP are not the firewall's.
    assert_eq!(drops(&sim, "out", "fw_denied_egress"), 0);
}

#[test]
fn trace_names_the_rule_and_the_state_and_changes_nothing() {
    let (options, ports) = options(GROUPS);
    let mut sim = Sim::with(1, options);
    let vm = sim.sw.add_inject_port_config(&ports[0]).unwrap();
    let out = sim.sw.add_inject_port_config(&ports[1]).unwrap();
    sim.send(
        &vm,
        &[tcp((OUT, OUT_IP, 443), (VM, VM_IP, 50000), SYN, 1000)],
    );
    out.take_captured();
    let syn80 = tcp((VM, VM_IP, 80), (OUT, OUT_IP, 40001), SYN, 1000);
    let r = sim.sw.trace("out", &syn80).unwrap();
    let text = r.steps.join("\n");
    assert!(
        text.contains("allowed by rule web/0: a new connection, state SYN_SENT"),
        "{text}"
    );
    let syn22 = tcp((VM, VM_IP, 22), (OUT, OUT_IP, 40001), SYN, 1000);
    let text = sim.sw.trace("out", &syn22).unwrap().steps.join("\n");
    assert!(
        text.contains("denied: no rule of its groups allows it ingress"),
        "{text}"
    );
    assert!(text.contains("fw_denied_ingress"), "{text}");
    let synack = tcp((VM, VM_IP, 50000), (OUT, OUT_IP, 443), SYN | ACK, 5000);
    let text = sim.sw.trace("out", &synack).unwrap().steps.join("\n");
    assert!(
        text.contains("tracked connection opened by rule web/1 (reply direction), state SYN_RECV"),
        "{text}"
    );
    let text = sim
        .sw
        .trace("vm", &tcp((OUT, OUT_IP, 443), (VM, VM_IP, 50001), SYN, 1))
        .unwrap()
        .steps
        .join("\n");
    assert!(
        text.contains("firewall (egress of vm): allowed by rule web/1"),
        "{text}"
    );
    assert_eq!(sim.sw.firewall().sessions(0), 1, "trace tracked nothing");
    assert_eq!(
        sim.sw
            .firewall()
            .zone(0)
            .unwrap()
            .new
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}
