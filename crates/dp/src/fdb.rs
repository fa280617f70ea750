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
//! # Limits (hostile ports)
//! The table holds at most [`MAX_ENTRIES`] addresses, and one port at most its MAC limit
//! ([`DEFAULT_PORT_LIMIT`] unless [`Fdb::set_port_limit`] says otherwise): a guest spraying
//! random source MACs fills its own share, not the table, so the other ports' addresses are
//! still learned and their unicast is never flooded to it. Addresses beyond a limit are not
//! learned (their frames still go out; replies to them are flooded) and each refusal is
//! counted. Both checks read atomics before the write lock is taken, so a full table or a
//! port at its limit costs a spraying port no more than a lookup.
//!
//! An address that moves between ports more than [`MOVES_PER_SEC`] times in a second is
//! flapping (two ports claim it, or one spoofs it): further moves in that second are refused
//! and counted as flaps on the port that claimed it, so a spoofer cannot keep stealing an
//! address back and forth. A single move (a VM that migrated, a cable moved) is learned at
//! once.
//!
//! A frame that proves nothing about where its source lives ([`Fdb::learn_unproven`]: a
//! VXLAN frame from a VTEP that is neither configured nor EVPN's) may add a new address or
//! refresh one already on its port, but never moves an address live on another port: one
//! datagram from the underlay cannot take a local VM's MAC. Such refusals are counted on the
//! port that claimed the address (`moves_held`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::RwLock;
use qswitch_wire::MacAddr;

use crate::ids::PortId;

/// Most addresses the table holds.
pub const MAX_ENTRIES: usize = 65_536;
/// Most addresses one port may have in the table unless configured otherwise.
pub const DEFAULT_PORT_LIMIT: u32 = 4096;
/// Port ids with their own limit and counters (larger ids share the table's limit only).
pub const PORT_SLOTS: usize = 4096;
/// A known address's time is rewritten at most this often.
pub const REFRESH_NS: u64 = 100_000_000;
/// Moves of one address allowed per second before it counts as flapping.
pub const MOVES_PER_SEC: u32 = 4;
const SEC: u64 = 1_000_000_000;

#[derive(Debug)]
struct Entry {
    port: AtomicU16,
    seen: AtomicU64,
    /// Start of the current one-second move window, and moves in it (write lock only).
    move_window: u64,
    moves: u32,
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

/// What [`Fdb::learn`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learn {
    /// Known on this port (its time refreshed if due).
    Known,
    /// New, now in the table.
    Added,
    /// Moved here from another port.
    Moved { from: PortId },
    /// Not learned: the port is at its MAC limit.
    PortLimit,
    /// Not learned: the table is full.
    TableFull,
    /// Not moved: the address is flapping between ports.
    Flap,
    /// Not moved: the address is live on another port and the frame brings no proof that it
    /// moved (a VXLAN frame from a VTEP that is neither configured nor EVPN's).
    Held,
}

/// Per-port MAC-table figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortFdbStats {
    /// Addresses the port has in the table now.
    pub entries: u32,
    /// Its limit.
    pub limit: u32,
    /// Addresses not learned because the port was at its limit.
    pub limit_refused: u64,
    /// Moves to the port refused because the address was flapping.
    pub flaps: u64,
    /// Moves to the port refused for lack of proof ([`Learn::Held`]).
    pub moves_held: u64,
}

#[derive(Debug)]
struct PortSlot {
    entries: AtomicU32,
    limit: AtomicU32,
    limit_refused: AtomicU64,
    flaps: AtomicU64,
    moves_held: AtomicU64,
}

/// The forwarding database.
#[derive(Debug)]
pub struct Fdb {
    map: RwLock<HashMap<(MacAddr, u16), Entry>>,
    /// `map.len()`, readable without the lock.
    len: AtomicUsize,
    ports: Box<[PortSlot]>,
    aging_ns: u64,
    /// Bumped whenever an address is added, moves or goes; lets workers validate caches.
    generation: AtomicU64,
    /// Refused because the table was full.
    full_refused: AtomicU64,
}

impl Fdb {
    /// A table whose entries expire `aging_ns` after they were last seen.
    pub fn new(aging_ns: u64) -> Fdb {
        Fdb {
            map: RwLock::new(HashMap::new()),
            len: AtomicUsize::new(0),
            ports: (0..PORT_SLOTS)
                .map(|_| PortSlot {
                    entries: AtomicU32::new(0),
                    limit: AtomicU32::new(DEFAULT_PORT_LIMIT),
                    limit_refused: AtomicU64::new(0),
                    flaps: AtomicU64::new(0),
                    moves_held: AtomicU64::new(0),
                })
                .collect(),
            aging_ns,
            generation: AtomicU64::new(0),
            full_refused: AtomicU64::new(0),
        }
    }

    /// The current generation (see the field).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Sets how many addresses `port` may have in the table (addresses it already has stay).
    pub fn set_port_limit(&self, port: PortId, limit: u32) {
        if let Some(s) = self.slot(port) {
            s.limit.store(limit, Ordering::Relaxed);
        }
    }

    /// The port's MAC-table figures.
    pub fn port_stats(&self, port: PortId) -> PortFdbStats {
        self.slot(port)
            .map_or_else(PortFdbStats::default, |s| PortFdbStats {
                entries: s.entries.load(Ordering::Relaxed),
                limit: s.limit.load(Ordering::Relaxed),
                limit_refused: s.limit_refused.load(Ordering::Relaxed),
                flaps: s.flaps.load(Ordering::Relaxed),
                moves_held: s.moves_held.load(Ordering::Relaxed),
            })
    }

    /// Addresses refused because the table was full.
    pub fn full_refused(&self) -> u64 {
        self.full_refused.load(Ordering::Relaxed)
    }

    #[inline]
    fn slot(&self, port: PortId) -> Option<&PortSlot> {
        self.ports.get(usize::from(port.0))
    }

    /// Records that `mac` in `vlan` was seen on `port` at `now`.
    pub fn learn(&self, mac: MacAddr, vlan: u16, port: PortId, now: u64) -> Learn {
        self.learn_as(mac, vlan, port, now, true)
    }

    /// Records that `mac` in `vlan` was seen on `port` at `now`, from a frame that proves
    /// nothing about where the address lives: a new address is learned and a known one
    /// refreshed, but an address live on another port stays there ([`Learn::Held`],
    /// counted on `port`). An entry that aged out may be taken over.
    pub fn learn_unproven(&self, mac: MacAddr, vlan: u16, port: PortId, now: u64) -> Learn {
        self.learn_as(mac, vlan, port, now, false)
    }

    fn learn_as(&self, mac: MacAddr, vlan: u16, port: PortId, now: u64, may_move: bool) -> Learn {
        let known = {
            let map = self.map.read();
            match map.get(&(mac, vlan)) {
                Some(e) if e.port.load(Ordering::Relaxed) == port.0 => {
                    if now.saturating_sub(e.seen.load(Ordering::Relaxed)) > REFRESH_NS {
                        e.seen.store(now, Ordering::Relaxed);
                    }
                    return Learn::Known;
                }
                Some(_) => true,
                None => false,
            }
        };
        let slot = self.slot(port);
        if !known {
            // Refusals are decided on atomics, before the write lock.
            if self.len.load(Ordering::Relaxed) >= MAX_ENTRIES {
                self.full_refused.fetch_add(1, Ordering::Relaxed);
                return Learn::TableFull;
            }
            if let Some(s) = slot {
                if s.entries.load(Ordering::Relaxed) >= s.limit.load(Ordering::Relaxed) {
                    s.limit_refused.fetch_add(1, Ordering::Relaxed);
                    return Learn::PortLimit;
                }
            }
        }
        let mut map = self.map.write();
        let outcome = match map.get_mut(&(mac, vlan)) {
            Some(e) => {
                let from = PortId(e.port.load(Ordering::Relaxed));
                if from == port {
                    return Learn::Known;
                }
                if !may_move && now.saturating_sub(e.seen.load(Ordering::Relaxed)) <= self.aging_ns
                {
                    if let Some(s) = slot {
                        s.moves_held.fetch_add(1, Ordering::Relaxed);
                    }
                    return Learn::Held;
                }
                if now.saturating_sub(e.move_window) >= SEC {
                    e.move_window = now;
                    e.moves = 0;
                }
                if e.moves >= MOVES_PER_SEC {
                    if let Some(s) = slot {
                        s.flaps.fetch_add(1, Ordering::Relaxed);
                    }
                    return Learn::Flap;
                }
                e.moves += 1;
                e.port.store(port.0, Ordering::Relaxed);
                e.seen.store(now, Ordering::Relaxed);
                if let Some(s) = self.slot(from) {
                    s.entries.fetch_sub(1, Ordering::Relaxed);
                }
                Learn::Moved { from }
            }
            None => {
                if map.len() >= MAX_ENTRIES {
                    self.full_refused.fetch_add(1, Ordering::Relaxed);
                    return Learn::TableFull;
                }
                map.insert(
                    (mac, vlan),
                    Entry {
                        port: AtomicU16::new(port.0),
                        seen: AtomicU64::new(now),
                        move_window: now,
                        moves: 0,
                    },
                );
                self.len.store(map.len(), Ordering::Relaxed);
                Learn::Added
            }
        };
        if let Some(s) = slot {
            s.entries.fetch_add(1, Ordering::Relaxed);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        outcome
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

    /// Forgets every address learned on `port` (the port is going away); its limit goes back
    /// to the default and its counters to zero, for the next port with that id.
    pub fn remove_port(&self, port: PortId) -> usize {
        let n = self.forget_port(port);
        if let Some(s) = self.slot(port) {
            s.limit.store(DEFAULT_PORT_LIMIT, Ordering::Relaxed);
            s.limit_refused.store(0, Ordering::Relaxed);
            s.flaps.store(0, Ordering::Relaxed);
            s.moves_held.store(0, Ordering::Relaxed);
        }
        n
    }

    /// Forgets every address learned on `port` (its policy changed); its limit and counters
    /// stay.
    pub fn forget_port(&self, port: PortId) -> usize {
        self.retain(|e| e.port.load(Ordering::Relaxed) != port.0)
    }

    fn retain(&self, keep: impl Fn(&Entry) -> bool) -> usize {
        let mut map = self.map.write();
        let before = map.len();
        map.retain(|_, e| {
            let k = keep(e);
            if !k {
                if let Some(s) = self.slot(PortId(e.port.load(Ordering::Relaxed))) {
                    s.entries.fetch_sub(1, Ordering::Relaxed);
                }
            }
            k
        });
        let removed = before - map.len();
        self.len.store(map.len(), Ordering::Relaxed);
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
        self.len.load(Ordering::Relaxed)
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

    fn mac(i: usize) -> MacAddr {
        let b = (i as u32).to_be_bytes();
        MacAddr([6, 0, b[0], b[1], b[2], b[3]])
    }

    #[test]
    fn table_is_bounded() {
        let f = Fdb::new(10 * SEC);
        for i in 0..MAX_ENTRIES + 10 {
            // Spread over ports so that no port's own limit is what stops it.
            let port = PortId((i / DEFAULT_PORT_LIMIT as usize) as u16);
            f.learn(mac(i), 0, port, 0);
        }
        assert_eq!(f.len(), MAX_ENTRIES);
        assert_eq!(f.full_refused(), 10);
        assert_eq!(f.learn(A, 0, PortId(100), 0), Learn::TableFull);
    }

    #[test]
    fn one_port_cannot_fill_the_table() {
        // F4: port 1 sprays more source MACs than the table holds; ports 2 and 3 are still
        // learned, so unicast between them is not flooded to port 1.
        let f = Fdb::new(10 * SEC);
        for i in 0..MAX_ENTRIES + 64 {
            f.learn(mac(i), 0, PortId(1), 0);
        }
        let s = f.port_stats(PortId(1));
        assert_eq!(s.entries, DEFAULT_PORT_LIMIT);
        assert_eq!(
            s.limit_refused,
            (MAX_ENTRIES + 64) as u64 - u64::from(DEFAULT_PORT_LIMIT)
        );
        assert_eq!(f.learn(A, 0, PortId(2), 0), Learn::Added);
        assert_eq!(f.learn(B, 0, PortId(3), 0), Learn::Added);
        assert_eq!(f.lookup(A, 0, 1), Some(PortId(2)));
        assert_eq!(f.lookup(B, 0, 1), Some(PortId(3)));
    }

    #[test]
    fn port_limit_is_configurable_and_freed_by_aging() {
        let f = Fdb::new(10 * SEC);
        f.set_port_limit(PortId(1), 2);
        assert_eq!(f.learn(mac(1), 0, PortId(1), 0), Learn::Added);
        assert_eq!(f.learn(mac(2), 0, PortId(1), 0), Learn::Added);
        assert_eq!(f.learn(mac(3), 0, PortId(1), 0), Learn::PortLimit);
        assert_eq!(f.port_stats(PortId(1)).entries, 2);
        f.sweep(11 * SEC);
        assert_eq!(f.port_stats(PortId(1)).entries, 0);
        assert_eq!(f.learn(mac(3), 0, PortId(1), 11 * SEC), Learn::Added);
        // A move counts against the new port's limit and frees the old port's.
        f.set_port_limit(PortId(2), 1);
        assert_eq!(
            f.learn(mac(3), 0, PortId(2), 11 * SEC),
            Learn::Moved { from: PortId(1) }
        );
        assert_eq!(f.port_stats(PortId(1)).entries, 0);
        assert_eq!(f.port_stats(PortId(2)).entries, 1);
        assert_eq!(f.remove_port(PortId(2)), 1);
        assert_eq!(
            f.port_stats(PortId(2)),
            PortFdbStats {
                limit: DEFAULT_PORT_LIMIT,
                ..PortFdbStats::default()
            }
        );
    }

    #[test]
    fn unproven_frames_never_move_a_live_address() {
        // F3 (audit of issue 27): a frame without proof learns new addresses but cannot
        // take one that is live on another port; once that entry aged out it can.
        let f = Fdb::new(10 * SEC);
        assert_eq!(f.learn(A, 0, PortId(1), 0), Learn::Added);
        assert_eq!(f.learn_unproven(A, 0, PortId(2), SEC), Learn::Held);
        assert_eq!(f.lookup(A, 0, SEC), Some(PortId(1)));
        assert_eq!(f.port_stats(PortId(2)).moves_held, 1);
        assert_eq!(f.learn_unproven(B, 0, PortId(2), SEC), Learn::Added);
        assert_eq!(f.learn_unproven(B, 0, PortId(2), 2 * SEC), Learn::Known);
        assert_eq!(
            f.learn_unproven(A, 0, PortId(2), 11 * SEC),
            Learn::Moved { from: PortId(1) }
        );
        // A proven frame moves at once.
        assert_eq!(
            f.learn(A, 0, PortId(1), 12 * SEC),
            Learn::Moved { from: PortId(2) }
        );
    }

    #[test]
    fn flapping_address_stops_moving() {
        let f = Fdb::new(300 * SEC);
        f.learn(A, 0, PortId(1), 0);
        let mut moves = 0;
        for i in 0..20u64 {
            let port = PortId(2 + (i % 2) as u16);
            if let Learn::Moved { .. } = f.learn(A, 0, port, i * 1000) {
                moves += 1;
            }
        }
        assert_eq!(moves, MOVES_PER_SEC);
        assert!(f.port_stats(PortId(2)).flaps + f.port_stats(PortId(3)).flaps > 0);
        // A second later the address may move again (a migration is learned at once).
        let from = f.lookup(A, 0, 2 * SEC).unwrap();
        assert_eq!(f.learn(A, 0, PortId(1), 2 * SEC), Learn::Moved { from });
    }
}
