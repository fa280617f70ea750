//! LLDP against a real partner (root): Debian's lldpd in a namespace this test creates, with
//! its control socket in the test's temp dir, on one end of a veth pair; the other end stays
//! in the test's namespace, where `qswitch_dp::port::bond::lldp` runs over an AF_PACKET
//! socket (the neighbour table and the transmitter, driven by the test's loop).
//!
//! - our LLDPDUs appear in `lldpcli show neighbors`: system name, port id = our ifname, TTL;
//! - lldpd's LLDPDUs parse into our table: its chassis id and port id (its MAC), system name,
//!   port description and TTL; when lldpd stops, the entry goes (its shutdown LLDPDU, or
//!   the TTL running out).
//!
//! lldpd is stopped by PID (SIGTERM, then SIGKILL) and the namespace and veth removed on
//! drop, also when an assertion fails.

use std::time::{Duration, Instant};

use qswitch_dp::port::bond::lldp::{Neighbors, Transmitter, TxConfig};
use qswitch_sys::packet::{PacketOptions, PacketSocket};
use qswitch_test_support::lldpd::{lldpd_or_skip, Lldpd};
use qswitch_test_support::{wait_until, TempDir};
use qswitch_wire::lldp::{chassis_subtype, port_subtype, Lldpdu};
use qswitch_wire::MacAddr;

const WAIT: Duration = Duration::from_secs(20);

fn read_sys(name: &str, what: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/net/{name}/{what}"))
        .unwrap_or_else(|e| panic!("/sys/class/net/{name}/{what}: {e}"))
        .trim()
        .to_string()
}

/// This side of the link: socket, table, transmitter.
struct Side {
    sock: PacketSocket,
    table: Neighbors,
    tx: Transmitter,
}

impl Side {
    /// One round: what arrived goes into the table, what is due goes out, aged entries go.
    fn step(&mut self) {
        let now = Instant::now();
        let table = &mut self.table;
        self.sock.rx.recv(32, |f| {
            if let Ok((src, pdu)) = Lldpdu::parse_frame(f.data) {
                table.receive(0, src, &pdu, now);
            }
        });
        table.expire(now);
        let sock = &self.sock;
        self.tx.poll(now, |_, frame| {
            sock.tx.send(&[frame]).expect("send LLDPDU");
        });
    }
}

#[test]
fn lldp_with_lldpd() {
    if !lldpd_or_skip() {
        return;
    }
    let pid = std::process::id();
    let dir = TempDir::new("lldp");
    let ours = format!("qd{}0", pid % 1_000_000);
    let mut lldpd = Lldpd::start(&dir, "d", &ours, None);
    let peer_name = lldpd.name.clone();

    let system_name = format!("qswitch-test-{pid}");
    let chassis: MacAddr = read_sys(&ours, "address").parse().expect("mac");
    let mut tx = Transmitter::new(TxConfig {
        chassis,
        system_name: system_name.clone(),
        system_description: Some("qswitch bond lldp test".into()),
        management: Some("192.0.2.1".parse().unwrap()),
        interval: Duration::from_secs(1),
    });
    tx.add_port(&ours, chassis, Instant::now());
    let ifindex: u32 = read_sys(&ours, "ifindex").parse().expect("ifindex");
    let mut side = Side {
        sock: PacketSocket::open(
            ifindex,
            PacketOptions {
                slot_size: 2048,
                slots: 64,
                promisc: false,
            },
        )
        .expect("AF_PACKET socket"),
        table: Neighbors::default(),
        tx,
    };

    // lldpd's frames parse into our table.
    let peer_mac: MacAddr = lldpd.ns.mac("eth0").parse().expect("mac");
    let heard = wait_until(WAIT, || {
        side.step();
        side.table
            .iter()
            .any(|n| n.system_name().as_deref() == Some(peer_name.as_str()))
    });
    assert!(heard, "lldpd's LLDPDUs not in our table: {:?}", side.table);
    let n = side
        .table
        .iter()
        .find(|n| n.system_name().as_deref() == Some(&peer_name))
        .unwrap();
    assert_eq!(n.src, peer_mac);
    assert_eq!(
        n.chassis_id.display(chassis_subtype::MAC_ADDRESS),
        peer_mac.to_string()
    );
    assert_eq!(
        n.port_id.display(port_subtype::MAC_ADDRESS),
        peer_mac.to_string()
    );
    assert_eq!(n.port_description().as_deref(), Some("eth0"));
    assert_eq!(n.ttl, 4, "tx-interval 1 s, hold 4");
    println!(
        "lldpd in our table: chassis {}, port {}, system name {:?}, ttl {}",
        n.chassis_id.display(chassis_subtype::MAC_ADDRESS),
        n.port_id.display(port_subtype::MAC_ADDRESS),
        n.system_name().unwrap_or_default(),
        n.ttl
    );

    // Our frames appear in lldpcli show neighbors.
    let mut shown = String::new();
    let seen = wait_until(WAIT, || {
        side.step();
        shown = lldpd.neighbors();
        shown.contains(&format!("chassis.name={system_name}"))
    });
    assert!(seen, "lldpd does not show us: {shown}");
    for want in [
        format!("lldp.eth0.chassis.mac={chassis}"),
        format!("lldp.eth0.port.ifname={ours}"),
        "lldp.eth0.port.ttl=5".to_string(),
        "lldp.eth0.chassis.mgmt-ip=192.0.2.1".to_string(),
        "lldp.eth0.chassis.descr=qswitch bond lldp test".to_string(),
    ] {
        assert!(shown.lines().any(|l| l == want), "no {want} in:\n{shown}");
    }

    // lldpd stops: its entry goes within its TTL.
    lldpd.stop();
    let gone = wait_until(Duration::from_secs(8), || {
        side.step();
        side.table.is_empty()
    });
    assert!(gone, "lldpd's entry outlived its TTL: {:?}", side.table);
}
