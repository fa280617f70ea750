//! LLDP (IEEE 802.1AB) for uplinks and bond members, as pure state: a neighbour table with
//! TTL aging, and a transmitter that says who this switch is on each local port. Time is
//! passed in, LLDPDUs go in as parsed values ([`qswitch_wire::lldp::Lldpdu`]) and come out as
//! frames; nothing here reads a clock, spawns or does I/O.
//!
//! * [`Neighbors`]: one entry per (local port, chassis id, port id), as 802.1AB's remote
//!   systems MIB keys it (9.2.7.7.3). A new LLDPDU replaces the entry and restarts its TTL; a
//!   TTL of 0 removes it at once (a neighbour shutting down, 9.2.7.7.2); [`Neighbors::expire`]
//!   removes entries whose TTL ran out. The table is bounded: at most
//!   [`Neighbors::max_per_port`] entries per local port; one more is refused and counted
//!   (802.1AB's `tooManyNeighbors`), so a flood of invented chassis ids costs bounded memory.
//! * [`Transmitter`]: every [`TxConfig::interval`] (30 s by default, `msgTxInterval`) one
//!   LLDPDU per local port: chassis id = the switch's MAC address, port id = the interface
//!   name (subtype 5), TTL = interval × hold (4) + 1 s, system name, optionally a system
//!   description and a management address. [`Transmitter::shutdown`] makes the TTL-0 frame
//!   a port sends when LLDP stops on it.
//!
//! Strings are kept as LLDP carries them, bytes, and shown with invalid UTF-8 replaced.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use qswitch_wire::lldp::{self, family, port_subtype, Id, Lldpdu, ManagementAddress};
use qswitch_wire::MacAddr;

/// `msgTxInterval`'s default (802.1AB 9.2.5.7).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// `msgTxHold`'s default: the TTL sent is this many intervals (plus one second).
pub const TX_HOLD: u32 = 4;
/// Neighbours kept per local port unless told otherwise (lldpd keeps 32).
pub const DEFAULT_MAX_PER_PORT: usize = 32;
/// The largest frame [`Transmitter`] builds: every string at its 255-byte limit.
pub const MAX_FRAME: usize = 1536;

/// A chassis or port id as received: subtype and bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnedId {
    pub subtype: u8,
    pub id: Vec<u8>,
}

impl OwnedId {
    fn of(id: &Id<'_>) -> OwnedId {
        OwnedId {
            subtype: id.subtype,
            id: id.id.to_vec(),
        }
    }

    /// The id for display: a MAC address as `aa:bb:..` when the subtype says MAC
    /// (`mac_subtype`) and it has six bytes, else text with invalid UTF-8 replaced.
    pub fn display(&self, mac_subtype: u8) -> String {
        match MacAddr::from_bytes(&self.id) {
            Some(mac) if self.subtype == mac_subtype && self.id.len() == 6 => mac.to_string(),
            _ => String::from_utf8_lossy(&self.id).into_owned(),
        }
    }
}

/// A management address as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedManagementAddress {
    pub family: u8,
    pub address: Vec<u8>,
    pub if_subtype: u8,
    pub if_number: u32,
}

impl OwnedManagementAddress {
    /// The address as an IP address, when it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        ManagementAddress {
            family: self.family,
            address: &self.address,
            if_subtype: self.if_subtype,
            if_number: self.if_number,
            oid: &[],
        }
        .ip()
    }
}

/// One neighbour heard on a local port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbor {
    /// The local port (or bond member) it was heard on, as the caller numbers them.
    pub local: usize,
    /// The neighbour's source MAC address.
    pub src: MacAddr,
    pub chassis_id: OwnedId,
    pub port_id: OwnedId,
    /// The TTL it announced, seconds.
    pub ttl: u16,
    pub port_description: Option<Vec<u8>>,
    pub system_name: Option<Vec<u8>>,
    pub system_description: Option<Vec<u8>>,
    pub management_address: Option<OwnedManagementAddress>,
    /// When its LLDPDU was last received.
    pub last_seen: Instant,
    /// When it is forgotten unless heard again.
    pub expires: Instant,
}

impl Neighbor {
    /// The system name, with invalid UTF-8 replaced.
    pub fn system_name(&self) -> Option<String> {
        self.system_name
            .as_deref()
            .map(|s| String::from_utf8_lossy(s).into_owned())
    }

    /// The port description, with invalid UTF-8 replaced.
    pub fn port_description(&self) -> Option<String> {
        self.port_description
            .as_deref()
            .map(|s| String::from_utf8_lossy(s).into_owned())
    }
}

/// What [`Neighbors::receive`] did with an LLDPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// A neighbour not known before.
    Added,
    /// A known neighbour, its information and TTL renewed.
    Refreshed,
    /// TTL 0: the neighbour was forgotten (or was not known).
    Removed,
    /// The local port already has the most neighbours allowed: refused.
    TooMany,
}

type Key = (usize, OwnedId, OwnedId);

/// The neighbours heard on every local port.
#[derive(Debug, Clone)]
pub struct Neighbors {
    table: BTreeMap<Key, Neighbor>,
    max_per_port: usize,
    /// LLDPDUs refused because a port had too many neighbours.
    pub too_many: u64,
    /// Entries removed because their TTL ran out.
    pub aged_out: u64,
}

impl Default for Neighbors {
    fn default() -> Neighbors {
        Neighbors::new(DEFAULT_MAX_PER_PORT)
    }
}

impl Neighbors {
    /// An empty table keeping at most `max_per_port` neighbours per local port.
    pub fn new(max_per_port: usize) -> Neighbors {
        Neighbors {
            table: BTreeMap::new(),
            max_per_port,
            too_many: 0,
            aged_out: 0,
        }
    }

    /// The most neighbours kept per local port.
    pub fn max_per_port(&self) -> usize {
        self.max_per_port
    }

    /// Records an LLDPDU from `src` received on local port `local` at `now`.
    pub fn receive(
        &mut self,
        local: usize,
        src: MacAddr,
        pdu: &Lldpdu<'_>,
        now: Instant,
    ) -> Update {
        let key = (
            local,
            OwnedId::of(&pdu.chassis_id),
            OwnedId::of(&pdu.port_id),
        );
        if pdu.ttl == 0 {
            self.table.remove(&key);
            return Update::Removed;
        }
        let known = self.table.contains_key(&key);
        if !known && self.on_port(local).count() >= self.max_per_port {
            self.too_many += 1;
            return Update::TooMany;
        }
        let neighbor = Neighbor {
            local,
            src,
            chassis_id: key.1.clone(),
            port_id: key.2.clone(),
            ttl: pdu.ttl,
            port_description: pdu.port_description.map(<[u8]>::to_vec),
            system_name: pdu.system_name.map(<[u8]>::to_vec),
            system_description: pdu.system_description.map(<[u8]>::to_vec),
            management_address: pdu.management_address.map(|m| OwnedManagementAddress {
                family: m.family,
                address: m.address.to_vec(),
                if_subtype: m.if_subtype,
                if_number: m.if_number,
            }),
            last_seen: now,
            expires: now + Duration::from_secs(u64::from(pdu.ttl)),
        };
        self.table.insert(key, neighbor);
        if known {
            Update::Refreshed
        } else {
            Update::Added
        }
    }

    /// Removes the neighbours whose TTL ran out by `now`; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let before = self.table.len();
        self.table.retain(|_, n| n.expires > now);
        let gone = before - self.table.len();
        self.aged_out += gone as u64;
        gone
    }

    /// Forgets every neighbour of local port `local` (its link went down, it was removed).
    pub fn forget_port(&mut self, local: usize) {
        self.table.retain(|k, _| k.0 != local);
    }

    /// When the next entry ages out, if any.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.table.values().map(|n| n.expires).min()
    }

    /// Every neighbour, by local port, then chassis id, then port id.
    pub fn iter(&self) -> impl Iterator<Item = &Neighbor> {
        self.table.values()
    }

    /// The neighbours of local port `local`.
    pub fn on_port(&self, local: usize) -> impl Iterator<Item = &Neighbor> {
        self.table.values().filter(move |n| n.local == local)
    }

    /// The number of neighbours.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no neighbour is known.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// What this switch says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxConfig {
    /// Chassis id: a MAC address of this host.
    pub chassis: MacAddr,
    /// System name (the host name), at most 255 bytes.
    pub system_name: String,
    /// System description, at most 255 bytes.
    pub system_description: Option<String>,
    /// A management address.
    pub management: Option<IpAddr>,
    /// The transmit interval (`msgTxInterval`).
    pub interval: Duration,
}

impl TxConfig {
    /// A one-line error when a field cannot be sent (a string longer than its TLV allows).
    pub fn check(&self) -> Result<(), String> {
        if self.system_name.is_empty() || self.system_name.len() > 255 {
            return Err(format!(
                "lldp: system name must be 1 to 255 bytes, not {}",
                self.system_name.len()
            ));
        }
        if self
            .system_description
            .as_ref()
            .is_some_and(|d| d.len() > 255)
        {
            return Err("lldp: system description longer than 255 bytes".into());
        }
        if self.interval.is_zero() {
            return Err("lldp: transmit interval must be at least 1 s".into());
        }
        Ok(())
    }

    /// The TTL sent: interval × [`TX_HOLD`] + 1 s (802.1AB 9.2.5.22), at most 65535.
    pub fn ttl(&self) -> u16 {
        let secs = self.interval.as_secs().saturating_mul(u64::from(TX_HOLD)) + 1;
        u16::try_from(secs).unwrap_or(u16::MAX)
    }
}

#[derive(Debug, Clone)]
struct TxPort {
    ifname: String,
    mac: MacAddr,
    next: Instant,
}

/// Sends an LLDPDU on each local port every interval.
#[derive(Debug, Clone)]
pub struct Transmitter {
    cfg: TxConfig,
    ports: Vec<TxPort>,
}

impl Transmitter {
    /// A transmitter with no ports yet.
    pub fn new(cfg: TxConfig) -> Transmitter {
        Transmitter {
            cfg,
            ports: Vec::new(),
        }
    }

    /// Adds local port `ifname` (at most 255 bytes; its MAC address is the frames' source); its first LLDPDU is
    /// due at `now`. Returns its index.
    pub fn add_port(&mut self, ifname: &str, mac: MacAddr, now: Instant) -> usize {
        self.ports.push(TxPort {
            ifname: ifname.to_string(),
            mac,
            next: now,
        });
        self.ports.len() - 1
    }

    /// Hands each frame due at `now` to `tx` with its port's index.
    pub fn poll(&mut self, now: Instant, mut tx: impl FnMut(usize, &[u8])) {
        let mut buf = [0u8; MAX_FRAME];
        for i in 0..self.ports.len() {
            if now < self.ports[i].next {
                continue;
            }
            self.ports[i].next = now + self.cfg.interval;
            if let Some(len) = self.frame(i, self.cfg.ttl(), &mut buf) {
                tx(i, &buf[..len]);
            }
        }
    }

    /// The frame port `i` sends when LLDP stops on it: TTL 0, so neighbours forget it now.
    pub fn shutdown(&self, i: usize) -> Option<Vec<u8>> {
        let mut buf = [0u8; MAX_FRAME];
        let len = self.frame(i, 0, &mut buf)?;
        Some(buf[..len].to_vec())
    }

    /// When [`poll`](Self::poll) next has a frame to send.
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.ports.iter().map(|p| p.next).min()
    }

    fn frame(&self, i: usize, ttl: u16, buf: &mut [u8]) -> Option<usize> {
        let port = self.ports.get(i)?;
        let addr = match self.cfg.management {
            Some(IpAddr::V4(a)) => Some((family::IPV4, a.octets().to_vec())),
            Some(IpAddr::V6(a)) => Some((family::IPV6, a.octets().to_vec())),
            None => None,
        };
        let chassis = self.cfg.chassis.0;
        let pdu = Lldpdu {
            chassis_id: Id {
                subtype: lldp::chassis_subtype::MAC_ADDRESS,
                id: &chassis,
            },
            port_id: Id {
                subtype: port_subtype::INTERFACE_NAME,
                id: port.ifname.as_bytes(),
            },
            ttl,
            port_description: Some(port.ifname.as_bytes()),
            system_name: Some(self.cfg.system_name.as_bytes()),
            system_description: self.cfg.system_description.as_deref().map(str::as_bytes),
            management_address: addr.as_ref().map(|(family, address)| ManagementAddress {
                family: *family,
                address,
                if_subtype: 1,
                if_number: 0,
                oid: &[],
            }),
        };
        pdu.frame(port.mac, buf).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qswitch_wire::lldp::chassis_subtype;

    const SRC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0x10]);

    fn pdu(chassis: &'static [u8], ttl: u16) -> Lldpdu<'static> {
        Lldpdu {
            chassis_id: Id {
                subtype: chassis_subtype::LOCAL,
                id: chassis,
            },
            port_id: Id {
                subtype: port_subtype::INTERFACE_NAME,
                id: b"swp1",
            },
            ttl,
            port_description: Some(b"to host1"),
            system_name: Some(b"tor1"),
            system_description: None,
            management_address: Some(ManagementAddress {
                family: family::IPV4,
                address: &[192, 0, 2, 9],
                if_subtype: 2,
                if_number: 3,
                oid: &[],
            }),
        }
    }

    #[test]
    fn neighbours_are_added_refreshed_aged_and_removed() {
        let t0 = Instant::now();
        let mut n = Neighbors::default();
        assert_eq!(n.receive(0, SRC, &pdu(b"tor1", 120), t0), Update::Added);
        assert_eq!(n.receive(1, SRC, &pdu(b"tor1", 120), t0), Update::Added);
        assert_eq!(n.len(), 2);
        let e = n.on_port(0).next().unwrap();
        assert_eq!(e.system_name().as_deref(), Some("tor1"));
        assert_eq!(e.port_description().as_deref(), Some("to host1"));
        assert_eq!(e.chassis_id.display(chassis_subtype::MAC_ADDRESS), "tor1");
        assert_eq!(
            e.management_address.as_ref().unwrap().ip(),
            Some("192.0.2.9".parse().unwrap())
        );
        // Refreshed at t0 + 100 s on port 0 only: port 1's entry ages out at t0 + 120 s.
        let t1 = t0 + Duration::from_secs(100);
        assert_eq!(n.receive(0, SRC, &pdu(b"tor1", 120), t1), Update::Refreshed);
        assert_eq!(n.next_expiry(), Some(t0 + Duration::from_secs(120)));
        assert_eq!(n.expire(t0 + Duration::from_secs(119)), 0);
        assert_eq!(n.expire(t0 + Duration::from_secs(120)), 1);
        assert_eq!((n.len(), n.aged_out), (1, 1));
        // TTL 0: gone at once.
        assert_eq!(n.receive(0, SRC, &pdu(b"tor1", 0), t1), Update::Removed);
        assert!(n.is_empty());
    }

    #[test]
    fn the_table_is_bounded_per_port() {
        let t0 = Instant::now();
        let mut n = Neighbors::new(2);
        assert_eq!(n.receive(0, SRC, &pdu(b"a", 120), t0), Update::Added);
        assert_eq!(n.receive(0, SRC, &pdu(b"b", 120), t0), Update::Added);
        assert_eq!(n.receive(0, SRC, &pdu(b"c", 120), t0), Update::TooMany);
        assert_eq!(n.receive(0, SRC, &pdu(b"a", 120), t0), Update::Refreshed);
        assert_eq!(n.receive(1, SRC, &pdu(b"c", 120), t0), Update::Added);
        assert_eq!((n.len(), n.too_many), (3, 1));
        n.forget_port(0);
        assert_eq!(n.len(), 1);
    }

    #[test]
    fn transmitter_sends_every_interval_with_ifname_and_ttl() {
        let t0 = Instant::now();
        let mut tx = Transmitter::new(TxConfig {
            chassis: MacAddr([2, 0, 0, 0, 0, 1]),
            system_name: "host1".into(),
            system_description: Some("qswitch".into()),
            management: Some("2001:db8::1".parse().unwrap()),
            interval: DEFAULT_INTERVAL,
        });
        tx.add_port("eth1", MacAddr([2, 0, 0, 0, 1, 1]), t0);
        tx.add_port("eth2", MacAddr([2, 0, 0, 0, 1, 2]), t0);
        let mut frames = Vec::new();
        tx.poll(t0, |i, f| frames.push((i, f.to_vec())));
        assert_eq!(frames.len(), 2);
        let (src, got) = Lldpdu::parse_frame(&frames[1].1).unwrap();
        assert_eq!(src, MacAddr([2, 0, 0, 0, 1, 2]));
        assert_eq!(got.port_id.id, b"eth2");
        assert_eq!(got.port_id.subtype, port_subtype::INTERFACE_NAME);
        assert_eq!(
            got.chassis_id.mac(chassis_subtype::MAC_ADDRESS),
            Some(MacAddr([2, 0, 0, 0, 0, 1]))
        );
        assert_eq!(got.ttl, 121);
        assert_eq!(got.system_name, Some(&b"host1"[..]));
        assert_eq!(
            got.management_address.unwrap().ip(),
            Some("2001:db8::1".parse().unwrap())
        );
        // Nothing until the interval has passed.
        frames.clear();
        tx.poll(t0 + Duration::from_secs(29), |i, f| {
            frames.push((i, f.to_vec()))
        });
        assert!(frames.is_empty());
        assert_eq!(tx.next_wakeup(), Some(t0 + DEFAULT_INTERVAL));
        tx.poll(t0 + DEFAULT_INTERVAL, |i, f| frames.push((i, f.to_vec())));
        assert_eq!(frames.len(), 2);
        let bye = tx.shutdown(0).unwrap();
        assert_eq!(Lldpdu::parse_frame(&bye).unwrap().1.ttl, 0);

        // Our own frames go into a table as a neighbour's would.
        let mut n = Neighbors::default();
        let (src, p) = Lldpdu::parse_frame(&frames[0].1).unwrap();
        assert_eq!(n.receive(7, src, &p, t0), Update::Added);
        let e = n.iter().next().unwrap();
        assert_eq!(e.port_id.display(port_subtype::MAC_ADDRESS), "eth1");
        assert_eq!(
            e.chassis_id.display(chassis_subtype::MAC_ADDRESS),
            "02:00:00:00:00:01"
        );
    }

    #[test]
    fn an_oversized_system_name_sends_nothing_rather_than_a_bad_frame() {
        let t0 = Instant::now();
        let mut tx = Transmitter::new(TxConfig {
            chassis: MacAddr([2, 0, 0, 0, 0, 1]),
            system_name: "x".repeat(300),
            system_description: None,
            management: None,
            interval: DEFAULT_INTERVAL,
        });
        assert!(tx.cfg.check().unwrap_err().contains("system name"));
        tx.add_port("eth1", MacAddr([2, 0, 0, 0, 1, 1]), t0);
        let mut sent = 0;
        tx.poll(t0, |_, _| sent += 1);
        assert_eq!(sent, 0);
    }
}
