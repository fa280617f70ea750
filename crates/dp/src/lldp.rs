//! LLDP (IEEE 802.1AB) in the running switch: one [`LldpAgent`] per port (or bond member)
//! whose `lldp` is `rx` or `both` ([`qswitch_api::config::PortConfig::lldp_mode`]; `rx` is
//! the default on uplinks). It wraps the pure machine of [`machine`] (also `crate::port::bond::lldp`) (the
//! neighbour table with TTL aging, the transmitter) with what a running switch needs:
//!
//! ```text
//!  worker: engine, stage link_local ── frame to 01:80:C2:00:00:0E on a port with an agent
//!          └─ LldpAgent::on_frame(frame, now): parse, try_lock, table.receive  (counted)
//!  housekeeping thread (every 100 ms), per agent:
//!          ├─ LldpAgent::expire(now): entries whose TTL ran out go
//!          └─ LldpAgent::due_tx(now) ─▶ the port's tx_burst   (lldp = "both": every 30 s,
//!                                        and at once when the host name changes)
//!  control: `qswitch lldp`, /metrics ◀─ LldpAgent::report(now)
//! ```
//!
//! - **Cost**: the agent hangs off the port's entry (`PortEntry::lldp`), looked at only on
//!   the link-local branch of the engine (multicast to 01:80:C2:00:00:0X, already cold), so
//!   a port without LLDP pays nothing and unicast pays nothing. Received LLDPDUs are still
//!   counted as the `lldp` drop (they are never relayed).
//! - **Never blocking a worker**: the table is behind a mutex that the worker only
//!   `try_lock`s; an LLDPDU that arrives while the control side holds it (a few
//!   microseconds, while it ages or reports) is counted in `discarded`, as are LLDPDUs that
//!   do not parse and neighbours beyond the per-port bound (32). A neighbour resends every
//!   30 s, so a lost LLDPDU costs nothing but a counter.
//! - **What is sent** (`lldp = "both"`): chassis id = a MAC address stable for the host
//!   (derived from `/etc/machine-id`, locally administered; the port's own MAC where there is
//!   none), port id = the interface name, port description = the interface name, TTL 121 s
//!   (30 s × 4 + 1), system name = the host name, system description = "qswitch VERSION",
//!   and the interface's first IPv4 address (else IPv6) as the management address when it
//!   has one. Frames leave from the interface's MAC address.
//! - **Bond members**: the agent knows nothing of the engine. A bond calls
//!   [`LldpAgent::on_frame`] for the LLDPDUs each member receives and sends what
//!   [`LldpAgent::due_tx`] returns by that member (see docs/teaming.md).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use qswitch_api::config::LldpMode;
use qswitch_api::request::{LldpNeighbor, LldpPort};
use qswitch_wire::lldp::{chassis_subtype, family, port_subtype, Lldpdu};
use qswitch_wire::MacAddr;

pub mod machine;

use machine::{Neighbors, Transmitter, TxConfig, Update, DEFAULT_INTERVAL};

/// Who this switch says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Chassis id (a MAC address).
    pub chassis: MacAddr,
    /// The host name.
    pub system_name: String,
}

impl Identity {
    /// This host: its name from the kernel, a chassis id from `/etc/machine-id` (or
    /// `fallback`, the port's MAC address, without one).
    pub fn of_host(fallback: MacAddr) -> Identity {
        Identity {
            chassis: machine_mac().unwrap_or(fallback),
            system_name: hostname(),
        }
    }
}

/// The host name (`/proc/sys/kernel/hostname`), or "qswitch" if it cannot be read.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s.len() <= 255)
        .unwrap_or_else(|| "qswitch".to_string())
}

/// A locally administered unicast MAC address derived from `/etc/machine-id` (FNV-1a), so
/// every port of the host sends the same chassis id, across restarts.
fn machine_mac() -> Option<MacAddr> {
    let id = std::fs::read_to_string("/etc/machine-id").ok()?;
    let id = id.trim();
    if id.is_empty() {
        return None;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    Some(MacAddr([
        (b[0] & 0xfc) | 0x02,
        b[1],
        b[2],
        b[3],
        b[4],
        b[5],
    ]))
}

/// The LLDP agent of one port or bond member (see the module docs).
#[derive(Debug)]
pub struct LldpAgent {
    ifname: String,
    mode: LldpMode,
    mac: MacAddr,
    management: Option<IpAddr>,
    /// The switch clock's 0 (`now` is nanoseconds on it) as an `Instant`, for the machine.
    epoch: Instant,
    state: Mutex<State>,
    rx: AtomicU64,
    tx: AtomicU64,
    discarded: AtomicU64,
}

#[derive(Debug)]
struct State {
    neighbors: Neighbors,
    /// `lldp = "both"`: the transmitter, with the identity it sends.
    tx: Option<(Identity, Transmitter)>,
}

impl LldpAgent {
    /// An agent on interface `ifname` (MAC `mac`, management address `management`) in
    /// `mode`, sending as `identity` when the mode is `both`; its first LLDPDU is due at
    /// once. `now` is the switch clock. `None` when the mode is `off`.
    pub fn new(
        ifname: &str,
        mode: LldpMode,
        mac: MacAddr,
        management: Option<IpAddr>,
        identity: Identity,
        now: u64,
    ) -> Option<LldpAgent> {
        if mode == LldpMode::Off {
            return None;
        }
        let epoch = Instant::now()
            .checked_sub(Duration::from_nanos(now))
            .unwrap_or_else(Instant::now);
        let agent = LldpAgent {
            ifname: ifname.to_string(),
            mode,
            mac,
            management,
            epoch,
            state: Mutex::new(State {
                neighbors: Neighbors::default(),
                tx: None,
            }),
            rx: AtomicU64::new(0),
            tx: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
        };
        if mode == LldpMode::Both {
            agent.set_identity(identity, now);
        }
        Some(agent)
    }

    fn instant(&self, now: u64) -> Instant {
        self.epoch + Duration::from_nanos(now)
    }

    /// The interface the agent runs on.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Its mode (`rx` or `both`).
    pub fn mode(&self) -> LldpMode {
        self.mode
    }

    /// A frame to 01:80:C2:00:00:0E received on the port at `now`: an LLDPDU goes into the
    /// table. Never blocks (from a worker): see the module docs for what is `discarded`.
    pub fn on_frame(&self, frame: &[u8], now: u64) {
        let Ok((src, pdu)) = Lldpdu::parse_frame(frame) else {
            self.discarded.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let Some(mut st) = self.state.try_lock() else {
            self.discarded.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let at = self.instant(now);
        match st.neighbors.receive(0, src, &pdu, at) {
            Update::TooMany => {
                self.discarded.fetch_add(1, Ordering::Relaxed);
            }
            Update::Added | Update::Refreshed | Update::Removed => {
                self.rx.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Forgets neighbours whose TTL ran out by `now`; returns how many.
    pub fn expire(&self, now: u64) -> usize {
        let at = self.instant(now);
        self.state.lock().neighbors.expire(at)
    }

    /// Sends as `identity` from now on; if it changed, the next LLDPDU is due at once (so
    /// neighbours learn a new host name without waiting 30 s). Only with `lldp = "both"`.
    pub fn set_identity(&self, identity: Identity, now: u64) {
        if self.mode != LldpMode::Both {
            return;
        }
        let mut st = self.state.lock();
        if st.tx.as_ref().is_some_and(|(id, _)| *id == identity) {
            return;
        }
        let cfg = TxConfig {
            chassis: identity.chassis,
            system_name: identity.system_name.clone(),
            system_description: Some(format!("qswitch {}", env!("CARGO_PKG_VERSION"))),
            management: self.management,
            interval: DEFAULT_INTERVAL,
        };
        if let Err(e) = cfg.check() {
            tracing::warn!(ifname = %self.ifname, error = %e, "LLDP: not transmitting");
        }
        let mut t = Transmitter::new(cfg);
        t.add_port(&self.ifname, self.mac, self.instant(now));
        st.tx = Some((identity, t));
    }

    /// The LLDPDU due at `now`, if one is (`lldp = "both"`: every 30 s); counted as sent.
    pub fn due_tx(&self, now: u64) -> Option<Vec<u8>> {
        let at = self.instant(now);
        let mut st = self.state.lock();
        let (_, t) = st.tx.as_mut()?;
        let mut out = None;
        t.poll(at, |_, f| out = Some(f.to_vec()));
        if out.is_some() {
            self.tx.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// The chassis id it sends, with `lldp = "both"`.
    pub fn chassis(&self) -> Option<MacAddr> {
        self.state.lock().tx.as_ref().map(|(id, _)| id.chassis)
    }

    /// The frame that tells neighbours to forget this port now (TTL 0), when it transmits.
    pub fn shutdown_frame(&self) -> Option<Vec<u8>> {
        let st = self.state.lock();
        st.tx.as_ref().and_then(|(_, t)| t.shutdown(0))
    }

    /// The number of neighbours.
    pub fn neighbor_count(&self) -> usize {
        self.state.lock().neighbors.len()
    }

    /// The agent as `qswitch lldp` shows it, for port `port`, at `now`.
    pub fn report(&self, port: &str, now: u64) -> LldpPort {
        let at = self.instant(now);
        let st = self.state.lock();
        LldpPort {
            port: port.to_string(),
            ifname: self.ifname.clone(),
            mode: self.mode.to_string(),
            rx: self.rx.load(Ordering::Relaxed),
            tx: self.tx.load(Ordering::Relaxed),
            discarded: self.discarded.load(Ordering::Relaxed),
            aged_out: st.neighbors.aged_out,
            neighbors: st
                .neighbors
                .iter()
                .map(|n| LldpNeighbor {
                    chassis_id: n.chassis_id.display(chassis_subtype::MAC_ADDRESS),
                    port_id: n.port_id.display(port_subtype::MAC_ADDRESS),
                    system_name: n.system_name(),
                    port_description: n.port_description(),
                    system_description: n
                        .system_description
                        .as_deref()
                        .map(|s| String::from_utf8_lossy(s).into_owned()),
                    management_address: n.management_address.as_ref().map(|m| {
                        match (m.ip(), m.family) {
                            (Some(ip), _) => ip.to_string(),
                            (None, f) if f == family::IPV4 || f == family::IPV6 => {
                                format!("{:02x?}", m.address)
                            }
                            (None, f) => format!("family {f}: {:02x?}", m.address),
                        }
                    }),
                    source_mac: n.src.to_string(),
                    ttl: n.ttl,
                    ttl_remaining_s: n.expires.saturating_duration_since(at).as_secs(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: u64 = 1_000_000_000;

    fn agent(mode: LldpMode) -> LldpAgent {
        LldpAgent::new(
            "eth1",
            mode,
            MacAddr([2, 0, 0, 0, 1, 1]),
            Some("192.0.2.7".parse().unwrap()),
            Identity {
                chassis: MacAddr([2, 0, 0, 0, 0, 1]),
                system_name: "host1".into(),
            },
            5 * NS,
        )
        .unwrap()
    }

    #[test]
    fn off_makes_no_agent() {
        let id = Identity {
            chassis: MacAddr([2, 0, 0, 0, 0, 1]),
            system_name: "h".into(),
        };
        assert!(LldpAgent::new("e", LldpMode::Off, MacAddr([2; 6]), None, id, 0).is_none());
    }

    #[test]
    fn both_sends_every_30_s_and_at_once_on_a_new_name_rx_never() {
        let a = agent(LldpMode::Both);
        let f = a.due_tx(5 * NS).expect("first LLDPDU at once");
        let (src, pdu) = Lldpdu::parse_frame(&f).unwrap();
        assert_eq!(src, MacAddr([2, 0, 0, 0, 1, 1]));
        assert_eq!(pdu.port_id.id, b"eth1");
        assert_eq!(pdu.system_name, Some(&b"host1"[..]));
        assert_eq!(pdu.ttl, 121);
        assert_eq!(
            pdu.management_address.unwrap().ip(),
            Some("192.0.2.7".parse().unwrap())
        );
        assert!(a.due_tx(34 * NS).is_none());
        assert!(a.due_tx(35 * NS).is_some());
        a.set_identity(
            Identity {
                chassis: MacAddr([2, 0, 0, 0, 0, 1]),
                system_name: "host2".into(),
            },
            36 * NS,
        );
        let f = a.due_tx(36 * NS).expect("sent at once on a change");
        assert_eq!(
            Lldpdu::parse_frame(&f).unwrap().1.system_name,
            Some(&b"host2"[..])
        );
        assert_eq!(a.report("p", 36 * NS).tx, 3);
        assert_eq!(
            Lldpdu::parse_frame(&a.shutdown_frame().unwrap())
                .unwrap()
                .1
                .ttl,
            0
        );
        let r = agent(LldpMode::Rx);
        assert!(r.due_tx(5 * NS).is_none());
        assert!(r.shutdown_frame().is_none());
    }

    #[test]
    fn received_lldpdus_are_kept_until_their_ttl_runs_out() {
        // Another switch's frame, made by the same machine.
        let peer = agent(LldpMode::Both);
        let frame = peer.due_tx(5 * NS).unwrap();
        let a = agent(LldpMode::Rx);
        a.on_frame(&frame, 10 * NS);
        a.on_frame(&frame[..20], 10 * NS);
        let r = a.report("up", 20 * NS);
        assert_eq!((r.rx, r.discarded, r.neighbors.len()), (1, 1, 1));
        let n = &r.neighbors[0];
        assert_eq!(n.chassis_id, "02:00:00:00:00:01");
        assert_eq!(n.port_id, "eth1");
        assert_eq!(n.system_name.as_deref(), Some("host1"));
        assert_eq!(n.port_description.as_deref(), Some("eth1"));
        assert_eq!(n.management_address.as_deref(), Some("192.0.2.7"));
        assert_eq!((n.ttl, n.ttl_remaining_s), (121, 111));
        assert_eq!(a.expire(130 * NS), 0);
        assert_eq!(a.expire(131 * NS), 1);
        let r = a.report("up", 131 * NS);
        assert_eq!((r.neighbors.len(), r.aged_out), (0, 1));
    }

    #[test]
    fn a_held_table_discards_rather_than_blocks() {
        let peer = agent(LldpMode::Both);
        let frame = peer.due_tx(5 * NS).unwrap();
        let a = agent(LldpMode::Rx);
        let held = a.state.lock();
        a.on_frame(&frame, 10 * NS);
        drop(held);
        assert_eq!(a.discarded.load(Ordering::Relaxed), 1);
        assert_eq!(a.neighbor_count(), 0);
    }
}
