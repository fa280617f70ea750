//! Helpers shared by the deterministic tests: a switch with no threads on a clock the test
//! moves, and frame builders.

// Each test crate uses its own subset.
#![allow(dead_code)]

use qswitch_dp::control::placement::Topology;
use qswitch_dp::port::inject::InjectPort;
use qswitch_dp::{Options, Switch};

pub const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
pub const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
pub const MAC_C: [u8; 6] = [2, 0, 0, 0, 0, 0xc];
pub const BCAST: [u8; 6] = [0xff; 6];

/// Polls a queue at most this often per `drain` before the test fails.
const MAX_POLLS: usize = 10_000;

/// A [`Switch::manual`] switch and its clock.
pub struct Sim {
    pub sw: Switch,
    /// The switch clock, nanoseconds.
    pub now: u64,
}

impl Sim {
    /// `workers` workers on CPUs 0.. of a synthetic one-package, four-core machine.
    pub fn new(workers: usize) -> Sim {
        Sim::with(workers, Options::default())
    }

    pub fn with(workers: usize, mut options: Options) -> Sim {
        options.topology = Some(Topology::synthetic(1, 4, 1));
        let cpus: Vec<usize> = (0..workers).collect();
        Sim {
            sw: Switch::manual(&cpus, &options).expect("manual switch"),
            now: 0,
        }
    }

    /// Moves the clock by `ns` and polls every queue once. Returns frames received.
    pub fn step(&mut self, ns: u64) -> usize {
        self.now += ns;
        self.sw.poll_once(self.now)
    }

    /// Queues `frames` on `port` and polls (1 µs apart) until the switch has taken them all;
    /// what it takes it transmits in the same poll.
    pub fn send(&mut self, port: &InjectPort, frames: &[Vec<u8>]) {
        for f in frames {
            port.inject(f);
        }
        self.drain(port);
    }

    /// Polls (1 µs apart) until `port` has nothing pending.
    pub fn drain(&mut self, port: &InjectPort) {
        let mut polls = 0;
        while port.pending() > 0 {
            polls += 1;
            assert!(
                polls < MAX_POLLS,
                "the switch does not take frames from the port"
            );
            self.step(1_000);
        }
    }
}

/// An untagged frame of `len` bytes (at least 14) with a local EtherType.
pub fn frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f
}

/// A 60-byte frame that carries `seq` after the header.
pub fn numbered(dst: [u8; 6], src: [u8; 6], seq: u64) -> Vec<u8> {
    let mut f = frame(dst, src, 60);
    f[14..22].copy_from_slice(&seq.to_be_bytes());
    f
}

/// The sequence number of a [`numbered`] frame.
pub fn seq_of(f: &[u8]) -> u64 {
    u64::from_be_bytes(f[14..22].try_into().expect("8 bytes"))
}

/// A bond port `name` (`mode`, LACP `lacp` at `rate`, no up/down delay) of AF_PACKET
/// members on the interfaces `ifnames`, as the bond tests against real links build it.
pub fn packet_bond(
    name: &str,
    mode: qswitch_api::BondMode,
    lacp: qswitch_api::LacpMode,
    rate: qswitch_api::LacpRate,
    ifnames: &[String],
) -> qswitch_api::PortConfig {
    qswitch_api::PortConfig::new(
        name,
        qswitch_api::PortKind::Bond(qswitch_api::BondConfig {
            mode,
            lacp,
            lacp_rate: rate,
            members: ifnames
                .iter()
                .map(|i| qswitch_api::BondMember {
                    kind: qswitch_api::PortType::Afxdp,
                    ifname: i.parse().unwrap(),
                    mode: Some(qswitch_api::XdpMode::Packet.into()),
                    queues: None,
                    fastpath: None,
                })
                .collect(),
            updelay: 0,
            downdelay: 0,
            lacp_fallback: false,
        }),
    )
}
