//! The MAC learning table (forwarding database): (MAC, VLAN) → port, with aging.
//!
//! Shared by all workers. Lookups and refreshes of known addresses take the read side of a
//! reader-writer lock; only a new or moved address takes the write side. A refresh stores the
//! time only when the stored time is more than [`REFRESH_NS`] old, so a busy flow does not
//! keep writing the entry's cache line. Workers put a one-entry cache in front of both
//! ([`crate::engine`]), so the table is touched about once per burst, not once per frame.
//!
//! Time is passed in (`now`, nanoseconds on the switch's monotonic clock): no clock reads
//! here, so aging is tested with an injected clock.
//!
//! # Limitations
//! The table holds at most [`MAX_ENTRIES`] addresses; beyond that, new addresses are not
//! learned (their frames are flooded) until aging frees room. A guest spraying random source
//! MACs therefore cannot grow memory without bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use parking_lot::RwLock;
use qswitch_wire::MacAddr;

use crate::ids::PortId;

/// Most addresses the table holds.
pub const MAX_ENTRIES: usize = 65_536;
/// A known address's time is rewritten at most this often.
pub const REFRESH_NS: u64 = 100_000_000;

#[derive(Debug)]
struct Entry {
    port: AtomicU16,
    seen: AtomicU64,
}

/// One learned address, as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learned {
    pub mac: MacAddr,
    pub vlan: u16,
    pub port: PortId,
    /// Nanoseconds since the address was last seen.
    pub age_ns: u64,
}

/// The forwarding database.
#[derive(Debug)]
pub struct Fdb {
    map: RwLock<HashMap<(MacAddr, u16), Entry>>,
    aging_ns: u64,
    /// Bumped whenever an address is added, moves or goes; lets workers validate caches.
    generation: AtomicU64,
}

impl Fdb {
    /// A table whose entries expire `aging_ns` after they were last seen.
    pub fn new(aging_ns: u64) -> Fdb {
        Fdb {
            map: RwLock::new(HashMap::new()),
            aging_ns,
            generation: AtomicU64::new(0),
        }
    }

    /// The current generation (see the field).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Records that `mac` in `vlan` was seen on `port` at `now`.
    pub fn learn(&self, mac: MacAddr, vlan: u16, port: PortId, now: u64) {
        {
            let map = self.map.read();
            if let Some(e) = map.get(&(mac, vlan)) {
                if e.port.load(Ordering::Relaxed) == port.0 {
                    if now.saturating_sub(e.seen.load(Ordering::Relaxed)) > REFRESH_NS {
                        e.seen.store(now, Ordering::Relaxed);
                    }
                    return;
                }
            }
        }
        let mut map = self.map.write();
        if map.len() >= MAX_ENTRIES && !map.contains_key(&(mac, vlan)) {
            return;
        }
        map.insert(
            (mac, vlan),
            Entry {
                port: AtomicU16::new(port.0),
                seen: AtomicU64::new(now),
            },
        );
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The port `mac` in `vlan` was last seen on, unless it has aged out.
    pub fn lookup(&self, mac: MacAddr, vlan: u16, now: u64) -> Option<PortId> {
        let map = self.map.read();
        let e = map.get(&(mac, vlan))?;
        if now.saturating_sub(e.seen.load(Ordering::Relaxed)) > self.aging_ns {
            return None;
        }
        Some(PortId(e.port.load(Ordering::Relaxed)))
    }

    /// Removes entries not seen for longer than the aging time. Returns how many went.
    pub fn sweep(&self, now: u64) -> usize {
        let aging = self.aging_ns;
        self.retain(|e| now.saturating_sub(e.seen.load(Ordering::Relaxed)) <= aging)
    }

    /// Forgets every address learned on `port` (the port is going away).
    pub fn remove_port(&self, port: PortId) -> usize {
        self.retain(|e| e.port.load(Ordering::Relaxed) != port.0)
    }

    fn retain(&self, keep: impl Fn(&Entry) -> bool) -> usize {
        let mut map = self.map.write();
        let before = map.len();
        map.retain(|_, e| keep(e));
        let removed = before - map.len();
        if removed > 0 {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        removed
    }

    /// Every live entry, sorted by VLAN then MAC.
    pub fn entries(&self, now: u64) -> Vec<Learned> {
        let map = self.map.read();
        let mut v: Vec<Learned> = map
            .iter()
            .map(|(&(mac, vlan), e)| Learned {
                mac,
                vlan,
                port: PortId(e.port.load(Ordering::Relaxed)),
                age_ns: now.saturating_sub(e.seen.load(Ordering::Relaxed)),
            })
            .filter(|l| l.age_ns <= self.aging_ns)
            .collect();
        v.sort_by_key(|l| (l.vlan, l.mac));
        v
    }

    /// Number of entries (including expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;
    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    #[test]
    fn learns_and_looks_up_per_vlan() {
        let f = Fdb::new(300 * SEC);
        f.learn(A, 0, PortId(1), 0);
        assert_eq!(f.lookup(A, 0, SEC), Some(PortId(1)));
        assert_eq!(f.lookup(A, 10, SEC), None, "VLANs are separate tables");
        assert_eq!(f.lookup(B, 0, SEC), None);
    }

    #[test]
    fn station_move_updates_port_and_generation() {
        let f = Fdb::new(300 * SEC);
        f.learn(A, 0, PortId(1), 0);
        let g = f.generation();
        f.learn(A, 0, PortId(1), SEC);
        assert_eq!(f.generation(), g, "a refresh is not a change");
        f.learn(A, 0, PortId(2), 2 * SEC);
        assert_eq!(f.lookup(A, 0, 2 * SEC), Some(PortId(2)));
        assert!(f.generation() > g);
    }

    #[test]
    fn ages_out_with_injected_clock() {
        let f = Fdb::new(10 * SEC);
        f.learn(A, 0, PortId(1), 0);
        f.learn(B, 0, PortId(2), 0);
        f.learn(B, 0, PortId(2), 8 * SEC); // refreshed
        assert_eq!(f.lookup(A, 0, 10 * SEC), Some(PortId(1)));
        assert_eq!(
            f.lookup(A, 0, 10 * SEC + 1),
            None,
            "expired entries are not used"
        );
        assert_eq!(f.entries(11 * SEC).len(), 1);
        assert_eq!(f.sweep(11 * SEC), 1);
        assert_eq!(f.len(), 1);
        assert_eq!(f.lookup(B, 0, 11 * SEC), Some(PortId(2)));
        assert_eq!(f.sweep(19 * SEC), 1);
        assert!(f.is_empty());
    }

    #[test]
    fn refresh_is_rate_limited() {
        let f = Fdb::new(10 * SEC);
        f.learn(A, 0, PortId(1), 0);
        f.learn(A, 0, PortId(1), REFRESH_NS / 2);
        assert_eq!(f.entries(REFRESH_NS / 2)[0].age_ns, REFRESH_NS / 2);
        f.learn(A, 0, PortId(1), 2 * REFRESH_NS);
        assert_eq!(f.entries(2 * REFRESH_NS)[0].age_ns, 0);
    }

    #[test]
    fn remove_port_forgets_its_addresses() {
        let f = Fdb::new(10 * SEC);
        f.learn(A, 0, PortId(1), 0);
        f.learn(B, 0, PortId(2), 0);
        assert_eq!(f.remove_port(PortId(1)), 1);
        assert_eq!(f.lookup(A, 0, 0), None);
        assert_eq!(f.lookup(B, 0, 0), Some(PortId(2)));
    }

    #[test]
    fn table_is_bounded() {
        let f = Fdb::new(10 * SEC);
        for i in 0..MAX_ENTRIES + 10 {
            let b = (i as u32).to_be_bytes();
            f.learn(MacAddr([2, 0, b[0], b[1], b[2], b[3]]), 0, PortId(1), 0);
        }
        assert_eq!(f.len(), MAX_ENTRIES);
    }
}
