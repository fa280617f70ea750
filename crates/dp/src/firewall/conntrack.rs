//! The connection table: fixed capacity, sharded, one short lock per shard.
//!
//! ```text
//!   key (zone, addresses, protocol, ports) ──symmetric keyed hash──▶ h
//!   shard = h & (S-1)      (both directions of a connection: the same shard)
//!   ┌─ shard 0 ─────────────────┐ ┌─ shard 1 ──┐      ┌─ shard S-1 ─┐
//!   │ Mutex {                   │ │    ...     │ .... │     ...     │
//!   │   buckets: [u32; B]  ─────┼─┼─▶ chains of entry indices       │
//!   │   entries: [Entry; C]     │ │            │      │             │
//!   │   free list, used         │ └────────────┘      └─────────────┘
//!   │ }  (128-byte aligned)     │
//!   └───────────────────────────┘
//! ```
//!
//! Everything is reserved when the table is made: `S × C` entries (each shard's pushed as
//! first used, never past `C`) and `S × B` bucket heads, with `C` the switch-wide limit
//! divided among the shards plus slack, so the memory is known in advance
//! ([`CtTable::memory_bytes`]). A worker looking a frame up takes the lock of one
//! shard for the few tens of nanoseconds of a chain walk and a state update; the two directions
//! of a connection meet in the same shard whichever worker polls them, and different
//! connections rarely share a shard (256 shards by default). Listing, flushing and expiry go
//! shard by shard, each lock held only for one shard's entries: a worker never waits longer
//! than one shard's walk. See docs/firewall.md for the argument for 16 workers.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;
use qswitch_wire::ct::CtKey;
use qswitch_wire::flow::IpPair;

const NIL: u32 = u32::MAX;

/// The `peer` of an entry that only one zone tracks.
pub const NO_PEER: u32 = u32::MAX;

/// The zone of an entry slot that holds no connection (on the free list, or never used):
/// a slot scan ([`CtTable::visit`]) tells live entries by it.
const FREE: u32 = u32::MAX;

/// Entry slots a slot scan looks at per lock hold: the longest a worker can wait on a
/// control-plane scan is one such chunk (a few microseconds), whatever the table's size.
pub const SCAN_CHUNK: usize = 256;

/// What [`CtTable::visit`]'s callback wants done with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Leave it (its changes through `&mut` kept).
    Keep,
    /// Remove it.
    Remove,
    /// Leave it and stop the scan.
    Stop,
}

/// Default number of shards (a power of two).
pub const DEFAULT_SHARDS: usize = 256;

/// Which rule made a connection: group index (in [`super::rules::RuleSet::groups`]) and rule
/// index in that group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RuleRef {
    pub group: u16,
    pub index: u16,
}

/// The state of a tracked connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CtState {
    /// TCP: the first SYN seen.
    #[default]
    SynSent,
    /// TCP: the SYN-ACK seen.
    SynRecv,
    /// TCP: the handshake done.
    Established,
    /// TCP: one side sent a FIN.
    FinWait,
    /// TCP: both sides sent a FIN, the last not yet acknowledged.
    Closing,
    /// TCP: both FINs acknowledged.
    TimeWait,
    /// TCP: reset.
    Close,
    /// UDP, SCTP, ICMP echo and other protocols: seen one way only.
    Unreplied,
    /// ... and seen both ways.
    Replied,
}

impl CtState {
    /// The name `ct list` and trace show.
    pub fn name(self) -> &'static str {
        match self {
            CtState::SynSent => "SYN_SENT",
            CtState::SynRecv => "SYN_RECV",
            CtState::Established => "ESTABLISHED",
            CtState::FinWait => "FIN_WAIT",
            CtState::Closing => "CLOSING",
            CtState::TimeWait => "TIME_WAIT",
            CtState::Close => "CLOSE",
            CtState::Unreplied => "UNREPLIED",
            CtState::Replied => "REPLIED",
        }
    }
}

/// TCP sequence tracking of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpDir {
    /// One past the highest sequence number this side sent (SYN and FIN count one).
    pub end: u32,
    /// The largest window this side advertised, in bytes (scaled when both sides scale).
    pub max_win: u32,
    /// The window scale of this side's SYN, if it had one.
    pub wscale: Option<u8>,
    /// This side sent a FIN.
    pub fin: bool,
}

/// One tracked connection, as [`CtTable::for_each`] shows it.
///
/// A connection between two filtered ports of this switch is one entry for both: `zone`
/// is the port whose filter tracked it first, `peer` the other (whose own rule allowed it,
/// `peer_rule`), [`NO_PEER`] when only one port tracks it. Both zones see the same packets,
/// so one state serves both, moved on once per frame (docs/firewall.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The zone: the port whose filter tracks the connection.
    pub zone: u32,
    /// The second zone sharing the connection, or [`NO_PEER`].
    pub peer: u32,
    /// The key of the first packet (the original direction).
    pub key: CtKey,
    pub state: CtState,
    /// Nanoseconds (of the clock the caller passes in) when the connection expires.
    pub expires: u64,
    /// The rule that allowed the first packet.
    pub rule: RuleRef,
    /// The rule of `peer`'s groups that allowed it there.
    pub peer_rule: RuleRef,
    /// TCP tracking: original direction, reply direction.
    pub tcp: [TcpDir; 2],
    next: u32,
}

impl Entry {
    /// A connection of `zone` opened by a packet with `key`.
    pub fn new(zone: u32, key: CtKey, state: CtState, expires: u64, rule: RuleRef) -> Entry {
        Entry {
            zone,
            key,
            state,
            expires,
            rule,
            ..EMPTY
        }
    }

    /// Whether `zone` tracks this connection (as its first zone or its peer).
    #[inline]
    pub fn covers(&self, zone: u32) -> bool {
        self.zone == zone || self.peer == zone
    }

    /// The rule that allowed the connection on `zone`'s port.
    #[inline]
    pub fn rule_for(&self, zone: u32) -> RuleRef {
        if self.zone == zone {
            self.rule
        } else {
            self.peer_rule
        }
    }

    /// The entry as `zone` sees it: its zone and rule first (what `ct list --port` shows).
    pub fn as_zone(&self, zone: u32) -> Entry {
        if self.peer != zone {
            return *self;
        }
        Entry {
            zone,
            peer: self.zone,
            rule: self.peer_rule,
            peer_rule: self.rule,
            ..*self
        }
    }
}

const EMPTY: Entry = Entry {
    zone: FREE,
    peer: NO_PEER,
    key: CtKey {
        ips: IpPair::V4 {
            src: [0; 4],
            dst: [0; 4],
        },
        proto: 0,
        src: 0,
        dst: 0,
    },
    state: CtState::SynSent,
    expires: 0,
    rule: RuleRef { group: 0, index: 0 },
    peer_rule: RuleRef { group: 0, index: 0 },
    tcp: [TcpDir {
        end: 0,
        max_win: 0,
        wscale: None,
        fin: false,
    }; 2],
    next: NIL,
};

/// Which way a packet goes on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// As the first packet.
    Original,
    /// Back.
    Reply,
}

impl Dir {
    pub fn index(self) -> usize {
        match self {
            Dir::Original => 0,
            Dir::Reply => 1,
        }
    }
}

struct Shard {
    /// Bucket heads: written under the shard's lock, read under it too, and read without
    /// it only as a prefetch hint ([`CtTable::prefetch`]), hence atomics (relaxed: plain
    /// moves on x86).
    buckets: std::sync::Arc<[AtomicU32]>,
    /// The entry slots handed out so far; its capacity (`cap`, reserved at start, never
    /// grown past) is the shard's share. Slots are taken from the free list first, then
    /// pushed, so the slots a scan walks ([`CtTable::visit`]) and the memory touched follow
    /// the most sessions the shard has held, not `max_sessions`.
    entries: Vec<Entry>,
    cap: usize,
    free: u32,
    used: u32,
}

/// A shard on its own cache lines, so that two workers on neighbouring shards do not
/// invalidate each other's lock word; with what a prefetch needs without the lock: the
/// bucket heads (shared with the shard) and where its entries are (an address, never
/// dereferenced: only given to the CPU as a hint).
#[repr(align(128))]
struct Padded(Mutex<Shard>, std::sync::Arc<[AtomicU32]>, usize, Ahead);

/// How far a shard's entry slots are known backed by memory ([`CtTable::prefault`]).
#[derive(Default)]
struct Ahead {
    /// Slots handed out so far (`entries.len()`), stored by an insert that pushes one.
    high: AtomicU32,
    /// `high` at the last pass of [`CtTable::prefault`].
    last: AtomicU32,
    /// Slots that pass has had backed.
    faulted: AtomicU32,
}

/// Why [`CtTable::insert`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The switch-wide `max_sessions`.
    Switch,
    /// The zone's (port's) `max_sessions`.
    Zone,
    /// The shard the connection hashes to has no free entry (the hash is keyed and the
    /// shards have slack, so this happens only near the switch-wide limit).
    Shard,
}

/// The connection table.
pub struct CtTable {
    shards: Box<[Padded]>,
    shard_mask: u64,
    bucket_mask: u64,
    seeds: [u64; 4],
    count: AtomicU32,
    /// Connections per zone.
    zones: Box<[AtomicU32]>,
    max: u32,
    capacity: usize,
    /// Bumped on every change a worker's verdict cache could have seen: an entry removed
    /// (expiry, flush, reopen), a zone detached from an entry (not one joining it:
    /// [`CtTable::attach`]), a rule set put in force ([`CtTable::bump`]). Starts at 1 (0 is
    /// an empty cache slot).
    generation: AtomicU64,
    /// [`CtTable::prefault`] found the kernel without `MADV_POPULATE_WRITE`.
    prefault_off: std::sync::atomic::AtomicBool,
}

/// 64 × 64 → 128-bit multiply folded to 64 bits: the mixing step of foldhash/wyhash.
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl CtTable {
    /// A table for at most `max_sessions` connections of `zones` zones over `shards` shards
    /// (rounded up to a power of two). Every entry is allocated now.
    pub fn new(max_sessions: u32, shards: usize, zones: usize) -> CtTable {
        let max = max_sessions.max(1);
        let shards = shards.max(1).next_power_of_two();
        // Each shard holds its share plus an eighth and 8 more: a keyed hash spreads
        // connections evenly, so a shard fills only when the switch nearly is.
        let share = (max as usize).div_ceil(shards);
        let per_shard = share + share / 8 + 8;
        let buckets = per_shard.next_power_of_two();
        let seed = std::collections::hash_map::RandomState::new();
        let mut seeds = [0u64; 4];
        for (i, s) in seeds.iter_mut().enumerate() {
            let mut h = seed.build_hasher();
            h.write_usize(i);
            *s = h.finish() | 1;
        }
        let shard_vec = (0..shards)
            .map(|_| {
                let entries = Vec::with_capacity(per_shard);
                let heads: std::sync::Arc<[AtomicU32]> =
                    (0..buckets).map(|_| AtomicU32::new(NIL)).collect();
                let at = entries.as_ptr() as usize;
                Padded(
                    Mutex::new(Shard {
                        buckets: heads.clone(),
                        entries,
                        cap: per_shard,
                        free: NIL,
                        used: 0,
                    }),
                    heads,
                    at,
                    Ahead::default(),
                )
            })
            .collect();
        CtTable {
            shards: shard_vec,
            shard_mask: (shards - 1) as u64,
            bucket_mask: (buckets - 1) as u64,
            seeds,
            count: AtomicU32::new(0),
            zones: (0..zones).map(|_| AtomicU32::new(0)).collect(),
            max,
            capacity: per_shard * shards,
            generation: AtomicU64::new(1),
            prefault_off: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Bytes the table holds, all allocated at creation.
    pub fn memory_bytes(&self) -> usize {
        let per_shard = self.shards.first().map_or(0, |s| {
            let s = s.0.lock();
            s.cap * std::mem::size_of::<Entry>() + s.buckets.len() * std::mem::size_of::<u32>()
        });
        per_shard * self.shards.len() + self.shards.len() * std::mem::size_of::<Padded>()
    }

    /// Entries allocated (the switch-wide limit plus the shards' slack).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The switch-wide limit.
    pub fn max_sessions(&self) -> u32 {
        self.max
    }

    /// Connections tracked now.
    pub fn len(&self) -> u32 {
        self.count.load(Ordering::Relaxed)
    }

    /// Connections of `zone` tracked now.
    pub fn zone_len(&self, zone: u32) -> u32 {
        self.zones
            .get(zone as usize)
            .map_or(0, |z| z.load(Ordering::Relaxed))
    }

    /// The change generation ([`super::cache`]): read once per burst by each worker.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Ends every worker's cached verdicts (from their next burst on).
    pub fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn gone(&self, zone: u32, n: u32) {
        self.bump();
        self.count.fetch_sub(n, Ordering::Relaxed);
        self.release(zone);
    }

    /// One zone's count less one (the entry stays: another zone still tracks it).
    fn release(&self, zone: u32) {
        if let Some(z) = self.zones.get(zone as usize) {
            z.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The counts of a removed entry: one entry, and each zone that tracked it.
    fn gone_entry(&self, e: &Entry) {
        self.bump();
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.release_zones(e.zone, e.peer);
    }

    /// The zone counts of a removed entry tracked by `zone` and `peer` ([`NO_PEER`]: none).
    fn release_zones(&self, zone: u32, peer: u32) {
        self.release(zone);
        if peer != NO_PEER {
            self.release(peer);
        }
    }

    /// Ends `zone`'s part of `e` (a flush of that port, a rule of it removed): the entry
    /// stays, as the other zone's alone, when another zone shares it ([`Visit::Keep`]);
    /// otherwise it is to be removed ([`Visit::Remove`], which counts it gone).
    pub fn detach(&self, e: &mut Entry, zone: u32) -> Visit {
        if e.peer == NO_PEER || !e.covers(zone) {
            return Visit::Remove;
        }
        if e.zone == zone {
            e.zone = e.peer;
            e.rule = e.peer_rule;
        }
        e.peer = NO_PEER;
        self.release(zone);
        self.bump();
        Visit::Keep
    }

    /// Whether no connection is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn endpoint(&self, ip: &[u8], port: u16) -> u64 {
        let (hi, lo) = if ip.len() == 4 {
            (
                0,
                u64::from(u32::from_be_bytes([ip[0], ip[1], ip[2], ip[3]])),
            )
        } else {
            let mut a = [0u8; 8];
            let mut b = [0u8; 8];
            a.copy_from_slice(&ip[..8]);
            b.copy_from_slice(&ip[8..16]);
            (u64::from_ne_bytes(a), u64::from_ne_bytes(b))
        };
        fold(
            hi ^ self.seeds[0],
            (lo ^ (u64::from(port) << 48)) ^ self.seeds[1],
        )
    }

    /// A hash of the connection the same for both directions: each endpoint is hashed on
    /// its own and the two are added. The zone is not in it: the entries of every zone
    /// for one connection share a chain, so that the two ports of a connection inside the
    /// switch find their one entry ([`Entry::peer`]) by one lookup from either side.
    #[inline]
    pub fn hash(&self, key: &CtKey) -> u64 {
        let (a, b) = match &key.ips {
            IpPair::V4 { src, dst } => (self.endpoint(src, key.src), self.endpoint(dst, key.dst)),
            IpPair::V6 { src, dst } => (self.endpoint(src, key.src), self.endpoint(dst, key.dst)),
        };
        let z = u64::from(key.proto);
        fold(a.wrapping_add(b) ^ self.seeds[2], z ^ self.seeds[3])
    }

    fn locate(&self, h: u64) -> (&Mutex<Shard>, usize) {
        let (shard, bucket) = self.locate_padded(h);
        (&shard.0, bucket)
    }

    #[inline]
    fn locate_padded(&self, h: u64) -> (&Padded, usize) {
        let shard = &self.shards[(h & self.shard_mask) as usize];
        // The bucket uses other bits of the hash than the shard.
        (shard, ((h >> 20) & self.bucket_mask) as usize)
    }

    /// Asks the CPU for the bucket head of hash `h` (see [`CtTable::hash`]): the first step
    /// of looking up a burst, before [`CtTable::prefetch_entry`] and [`CtTable::with_hash`],
    /// so that the cache misses of a big table overlap instead of coming one by one.
    #[inline]
    pub fn prefetch_bucket(&self, h: u64) {
        let (shard, bucket) = self.locate_padded(h);
        if let Some(head) = shard.1.get(bucket) {
            qswitch_sys::cpu::prefetch(head);
        }
    }

    /// Asks the CPU for the first entry of the bucket of hash `h` (both cache lines it may
    /// span), reading the bucket head without the lock: a hint only, a stale head costs a
    /// useless prefetch.
    #[inline]
    pub fn prefetch_entry(&self, h: u64) {
        let (shard, bucket) = self.locate_padded(h);
        let Some(head) = shard.1.get(bucket) else {
            return;
        };
        let i = head.load(Ordering::Relaxed);
        if i != NIL {
            let size = std::mem::size_of::<Entry>();
            let at = shard.2.wrapping_add((i as usize).wrapping_mul(size));
            qswitch_sys::cpu::prefetch(at as *const u8);
            qswitch_sys::cpu::prefetch(at.wrapping_add(size - 1) as *const u8);
        }
    }

    /// Finds the connection of `key` that `zone` tracks (as its zone or its peer) and runs
    /// `f` on it under the shard's lock, with the direction the key goes and the entry's
    /// slot. An expired entry is removed and not shown. `f` returns whether to remove the
    /// entry.
    #[inline]
    pub fn with<R>(
        &self,
        zone: u32,
        key: &CtKey,
        now: u64,
        f: impl FnOnce(&mut Entry, Dir, u32) -> (R, bool),
    ) -> Option<R> {
        self.with_hash(self.hash(key), zone, key, now, f)
    }

    /// [`CtTable::with`] with the key's hash already computed (`h` must be
    /// [`CtTable::hash`] of `key`).
    #[inline]
    pub fn with_hash<R>(
        &self,
        h: u64,
        zone: u32,
        key: &CtKey,
        now: u64,
        f: impl FnOnce(&mut Entry, Dir, u32) -> (R, bool),
    ) -> Option<R> {
        let (shard, bucket) = self.locate(h);
        let mut s = shard.lock();
        let mut prev = NIL;
        let mut i = s.head(bucket);
        while i != NIL {
            let e = &mut s.entries[i as usize];
            let next = e.next;
            if e.covers(zone) {
                let dir = if e.key == *key {
                    Some(Dir::Original)
                } else if reverse_of(&e.key, key) {
                    Some(Dir::Reply)
                } else {
                    None
                };
                if let Some(dir) = dir {
                    if e.expires <= now {
                        let e = *e;
                        s.unlink(bucket, prev, i);
                        self.gone_entry(&e);
                        return None;
                    }
                    let (r, remove) = f(e, dir, i);
                    if remove {
                        let e = *e;
                        s.unlink(bucket, prev, i);
                        self.gone_entry(&e);
                    }
                    return Some(r);
                }
            }
            prev = i;
            i = next;
        }
        None
    }

    /// Adds a connection (look first: this is for keys [`CtTable::with`] did not find).
    /// Returns its slot, or `Ok(None)` and adds nothing when the connection is there after all, in
    /// either direction: the other direction's worker added it between the look and this
    /// call (both directions hash to the same bucket, and the check runs under its lock).
    /// Fails when the switch-wide limit, the zone's `zone_max` or the shard is full;
    /// expired entries of the shard are reclaimed first in the last case.
    pub fn insert(
        &self,
        entry: Entry,
        now: u64,
        zone_max: Option<u32>,
    ) -> Result<Option<u32>, Full> {
        self.insert_hashed(self.hash(&entry.key), entry, now, zone_max)
    }

    /// [`CtTable::insert`] with the key's hash already computed (`h` must be
    /// [`CtTable::hash`] of `entry.key`).
    pub fn insert_hashed(
        &self,
        h: u64,
        entry: Entry,
        now: u64,
        zone_max: Option<u32>,
    ) -> Result<Option<u32>, Full> {
        if self.count.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.count.fetch_sub(1, Ordering::Relaxed);
            return Err(Full::Switch);
        }
        let Some(zone) = self.zones.get(entry.zone as usize) else {
            self.count.fetch_sub(1, Ordering::Relaxed);
            return Err(Full::Zone);
        };
        if zone.fetch_add(1, Ordering::Relaxed) >= zone_max.unwrap_or(u32::MAX) {
            self.gone(entry.zone, 1);
            return Err(Full::Zone);
        }
        let (padded, bucket) = self.locate_padded(h);
        let mut s = padded.0.lock();
        let reversed = entry.key.reversed();
        let mut i = s.head(bucket);
        while i != NIL {
            let e = &s.entries[i as usize];
            if e.covers(entry.zone) && e.expires > now && (e.key == entry.key || e.key == reversed)
            {
                drop(s);
                self.gone(entry.zone, 1);
                return Ok(None);
            }
            i = e.next;
        }
        if s.free == NIL && s.entries.len() < s.cap {
            // A slot never used yet (within the capacity reserved: no reallocation).
            s.free = u32::try_from(s.entries.len()).unwrap_or(NIL);
            s.entries.push(EMPTY);
            padded
                .3
                .high
                .store(s.free.wrapping_add(1), Ordering::Relaxed);
        }
        if s.free == NIL {
            s.sweep(now, None, self);
        }
        let i = s.free;
        if i == NIL {
            self.gone(entry.zone, 1);
            return Err(Full::Shard);
        }
        s.free = s.entries[i as usize].next;
        s.entries[i as usize] = Entry {
            next: s.head(bucket),
            peer: NO_PEER,
            ..entry
        };
        s.set_head(bucket, i);
        s.used += 1;
        if s.free == NIL && s.entries.len() < s.cap {
            // The slot this shard's next new connection takes: never written, so its
            // lines are in no cache; ask for them now (a few hundred new connections of
            // other shards come before it) rather than wait on them then.
            let size = std::mem::size_of::<Entry>();
            let next = padded.2.wrapping_add(s.entries.len().wrapping_mul(size));
            qswitch_sys::cpu::prefetch_write(next as *const u8);
            qswitch_sys::cpu::prefetch_write(next.wrapping_add(size - 1) as *const u8);
        }
        Ok(Some(i))
    }

    /// Makes `peer` the second zone of the connection of `key` in slot `slot` of the shard
    /// of hash `h` (the slot a check of the same frame by the entry's zone just found or
    /// made: [`super::Seen`]), allowed there by `rule`, instead of a second entry. `None`
    /// when that slot no longer holds it, it has a peer already, or another entry tracks
    /// the connection for `peer` (then the caller inserts as usual); `Some(Err)` when
    /// `peer`'s `zone_max` is reached.
    #[allow(clippy::too_many_arguments)]
    pub fn attach(
        &self,
        h: u64,
        slot: u32,
        key: &CtKey,
        peer: u32,
        rule: RuleRef,
        now: u64,
        zone_max: Option<u32>,
    ) -> Option<Result<(), Full>> {
        let counter = self.zones.get(peer as usize)?;
        let (shard, bucket) = self.locate(h);
        let mut s = shard.lock();
        let e = s.entries.get(slot as usize)?;
        let same = e.key == *key || reverse_of(&e.key, key);
        if e.zone == FREE || e.peer != NO_PEER || e.zone == peer || e.expires <= now || !same {
            return None;
        }
        // No other entry of `peer` for the connection (one could have been added by
        // another worker between the caller's look and this lock).
        let mut i = s.head(bucket);
        while i != NIL {
            let o = &s.entries[i as usize];
            if o.covers(peer) && o.expires > now && (o.key == *key || reverse_of(&o.key, key)) {
                return None;
            }
            i = o.next;
        }
        if counter.fetch_add(1, Ordering::Relaxed) >= zone_max.unwrap_or(u32::MAX) {
            counter.fetch_sub(1, Ordering::Relaxed);
            return Some(Err(Full::Zone));
        }
        let e = &mut s.entries[slot as usize];
        e.peer = peer;
        e.peer_rule = rule;
        // No generation bump: a zone joining only adds what the entry covers, so a
        // verdict cached before it is still right (a cached `Seen` without the peer sends
        // the peer's filter to the table, which finds the entry; docs/firewall.md). A
        // bump here would empty every worker's cache once per new connection.
        Some(Ok(()))
    }

    /// Removes the expired entries (the control thread's sweep, about once a second);
    /// returns how many went. What [`CtTable::visit`] does for them, with as little as can
    /// be under each shard's lock, because the sweeping thread may be preempted while it
    /// holds one (its CPU is shared), stalling every worker that needs that shard until it
    /// runs again: the lock is held once to find a chunk's expired slots (a compare per
    /// slot), their buckets are hashed and asked of the CPU without it, and it is held
    /// again to unlink them (each checked again: a packet may have renewed it meanwhile);
    /// the counters and the generation are updated after, once per chunk.
    pub fn expire(&self, now: u64) -> u32 {
        let mut removed = 0;
        let mut found: Vec<(u32, CtKey, usize)> = Vec::with_capacity(SCAN_CHUNK);
        let mut zones: Vec<(u32, u32)> = Vec::with_capacity(SCAN_CHUNK);
        for shard in self.shards.iter() {
            let mut start = 0;
            loop {
                found.clear();
                {
                    let s = shard.0.lock();
                    let end = (start + SCAN_CHUNK).min(s.entries.len());
                    if start >= end {
                        break;
                    }
                    for (i, e) in s.entries[start..end].iter().enumerate() {
                        if e.zone != FREE && e.expires <= now {
                            found.push(((start + i) as u32, e.key, 0));
                        }
                    }
                    start = end;
                }
                if found.is_empty() {
                    continue;
                }
                for (_, key, bucket) in found.iter_mut() {
                    let h = self.hash(key);
                    *bucket = self.locate(h).1;
                    self.prefetch_bucket(h);
                }
                zones.clear();
                {
                    let mut s = shard.0.lock();
                    for &(i, key, bucket) in &found {
                        let e = s.entries[i as usize];
                        if e.zone != FREE
                            && e.key == key
                            && e.expires <= now
                            && s.unlink_slot(bucket, i)
                        {
                            zones.push((e.zone, e.peer));
                        }
                    }
                }
                if zones.is_empty() {
                    continue;
                }
                self.count.fetch_sub(zones.len() as u32, Ordering::Relaxed);
                for &(zone, peer) in &zones {
                    self.release_zones(zone, peer);
                }
                self.bump();
                removed += zones.len() as u32;
            }
        }
        removed
    }

    /// Has the kernel back, from the calling thread, the entry slots each shard is about
    /// to hand out for the first time ([`qswitch_sys::anon::populate_write`]): twice as
    /// many as the shard handed out since the last call, at least a page's worth, ahead of
    /// the last one handed out. Slots are pushed in order and reserved at creation, so a
    /// connection storm otherwise has its worker take a page fault and zero a page every
    /// ~36 new connections (a quarter of its time, measured). Called every housekeeping
    /// tick; a shard that did not grow costs two loads. Returns the bytes asked for.
    pub fn prefault(&self) -> usize {
        const PAGE: u32 = 4096;
        if self.prefault_off.load(Ordering::Relaxed) {
            return 0;
        }
        let size = std::mem::size_of::<Entry>();
        let page_slots = (PAGE as usize).div_ceil(size) as u32;
        let cap = u32::try_from(self.capacity / self.shards.len()).unwrap_or(u32::MAX);
        let mut asked = 0;
        for shard in self.shards.iter() {
            let ahead = &shard.3;
            let high = ahead.high.load(Ordering::Relaxed);
            let last = ahead.last.swap(high, Ordering::Relaxed);
            let done = ahead.faulted.load(Ordering::Relaxed);
            let want = high
                .saturating_add(high.saturating_sub(last).saturating_mul(2).max(page_slots))
                .min(cap);
            if want <= done.max(high) {
                continue;
            }
            let from = done.max(high) as usize;
            let at = shard.2 + from * size;
            let len = (want as usize - from) * size;
            if let Err(e) = qswitch_sys::anon::populate_write(at, len) {
                if e.kind() == std::io::ErrorKind::InvalidInput {
                    // A kernel before 5.14: the workers fault the slots in as before.
                    self.prefault_off.store(true, Ordering::Relaxed);
                    return asked;
                }
                continue;
            }
            ahead.faulted.store(want, Ordering::Relaxed);
            asked += len;
        }
        asked
    }

    /// Calls `f` on every live entry, one shard at a time; stops when `f` returns false.
    /// Each shard's lock is held while its entries are copied out, not while `f` runs.
    pub fn for_each(&self, now: u64, mut f: impl FnMut(&Entry) -> bool) {
        let mut batch = Vec::new();
        for shard in self.shards.iter() {
            batch.clear();
            {
                let s = shard.0.lock();
                for head in s.buckets.iter() {
                    let mut i = head.load(Ordering::Relaxed);
                    while i != NIL {
                        let e = &s.entries[i as usize];
                        if e.expires > now {
                            batch.push(*e);
                        }
                        i = e.next;
                    }
                }
            }
            for e in &batch {
                if !f(e) {
                    return;
                }
            }
        }
    }

    /// Removes the expired entries, and with `remove` those it says to (a flush of one zone,
    /// connections a changed rule no longer allows), shard by shard. Returns how many went.
    pub fn sweep(&self, now: u64, remove: Option<&dyn Fn(&Entry) -> bool>) -> u32 {
        self.shards
            .iter()
            .map(|shard| shard.0.lock().sweep(now, remove, self))
            .sum()
    }
}

impl CtTable {
    /// Visits every live entry, shard by shard and [`SCAN_CHUNK`] slots per lock hold, and
    /// lets `f` keep (and change), remove, or stop. Expired entries are removed on the way
    /// without being shown. Returns how many entries went.
    ///
    /// This is the control plane's way through the table (listing, flushing a port,
    /// revalidating connections after a rule change): a worker that needs a shard waits at
    /// most one chunk's work, and the scan stops as soon as `f` has what it wants. Entries
    /// added, removed or moved while the scan runs may be seen or missed: a listing is a
    /// view of a table that changes under it, as `conntrack -L` is.
    pub fn visit(&self, now: u64, mut f: impl FnMut(&mut Entry) -> Visit) -> u32 {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let slots = shard.0.lock().entries.len();
            let mut start = 0;
            while start < slots {
                let end = (start + SCAN_CHUNK).min(slots);
                let mut s = shard.0.lock();
                let mut stop = false;
                for i in start..end {
                    let e = &mut s.entries[i];
                    if e.zone == FREE {
                        continue;
                    }
                    let action = if e.expires <= now {
                        Visit::Remove
                    } else {
                        f(e)
                    };
                    match action {
                        Visit::Keep => {}
                        Visit::Stop => {
                            stop = true;
                            break;
                        }
                        Visit::Remove => {
                            let e = *e;
                            let (_, bucket) = self.locate(self.hash(&e.key));
                            if s.unlink_slot(bucket, i as u32) {
                                self.gone_entry(&e);
                                removed += 1;
                            }
                        }
                    }
                }
                drop(s);
                if stop {
                    return removed;
                }
                start = end;
            }
        }
        removed
    }

    /// Up to `limit` live entries of `zone` (of every zone: `None`), copied out with
    /// [`CtTable::visit`]. Stops early once it has them, or when the zone has no more
    /// connections than it found, so a short listing of a large table costs little. An
    /// entry two zones share is shown as each sees it ([`Entry::as_zone`]): once for
    /// `zone`, twice for all.
    pub fn list(&self, now: u64, zone: Option<u32>, limit: usize) -> Vec<Entry> {
        let total = match zone {
            Some(z) => self.zone_len(z) as usize,
            // Each zone's view of the entries it tracks (a shared entry is two).
            None => (self.zones.iter())
                .map(|z| z.load(Ordering::Relaxed) as usize)
                .sum(),
        };
        let want = limit.min(total);
        let mut out = Vec::with_capacity(want);
        if want == 0 {
            return out;
        }
        self.visit(now, |e| {
            match zone {
                Some(z) if e.covers(z) => out.push(e.as_zone(z)),
                Some(_) => {}
                None => {
                    out.push(*e);
                    if e.peer != NO_PEER && out.len() < want {
                        out.push(e.as_zone(e.peer));
                    }
                }
            }
            if out.len() >= want {
                return Visit::Stop;
            }
            Visit::Keep
        });
        out
    }
}

/// Whether `b` is `a` the other way round (without building the reversed key).
#[inline]
fn reverse_of(a: &CtKey, b: &CtKey) -> bool {
    a.proto == b.proto
        && a.src == b.dst
        && a.dst == b.src
        && match (&a.ips, &b.ips) {
            (IpPair::V4 { src, dst }, IpPair::V4 { src: s2, dst: d2 }) => src == d2 && dst == s2,
            (IpPair::V6 { src, dst }, IpPair::V6 { src: s2, dst: d2 }) => src == d2 && dst == s2,
            _ => false,
        }
}

impl Shard {
    #[inline]
    fn head(&self, bucket: usize) -> u32 {
        self.buckets[bucket].load(Ordering::Relaxed)
    }

    #[inline]
    fn set_head(&self, bucket: usize, i: u32) {
        self.buckets[bucket].store(i, Ordering::Relaxed);
    }

    fn unlink(&mut self, bucket: usize, prev: u32, i: u32) {
        let next = self.entries[i as usize].next;
        if prev == NIL {
            self.set_head(bucket, next);
        } else {
            self.entries[prev as usize].next = next;
        }
        self.entries[i as usize].next = self.free;
        self.entries[i as usize].zone = FREE;
        self.entries[i as usize].peer = NO_PEER;
        self.free = i;
        self.used -= 1;
    }

    /// Unlinks the live entry in slot `i`, which hashes to `bucket`; false if it is not in
    /// that bucket's chain (it always is).
    fn unlink_slot(&mut self, bucket: usize, i: u32) -> bool {
        let mut prev = NIL;
        let mut j = self.head(bucket);
        while j != NIL {
            if j == i {
                self.unlink(bucket, prev, i);
                return true;
            }
            prev = j;
            j = self.entries[j as usize].next;
        }
        false
    }

    fn sweep(&mut self, now: u64, remove: Option<&dyn Fn(&Entry) -> bool>, t: &CtTable) -> u32 {
        let mut freed = 0;
        for bucket in 0..self.buckets.len() {
            let mut prev = NIL;
            let mut i = self.head(bucket);
            while i != NIL {
                let e = &self.entries[i as usize];
                let next = e.next;
                if e.expires <= now || remove.is_some_and(|r| r(e)) {
                    t.gone_entry(e);
                    self.unlink(bucket, prev, i);
                    freed += 1;
                } else {
                    prev = i;
                }
                i = next;
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(src: u8, sport: u16) -> CtKey {
        CtKey {
            ips: IpPair::V4 {
                src: [10, 0, 0, src],
                dst: [10, 0, 0, 200],
            },
            proto: 17,
            src: sport,
            dst: 53,
        }
    }

    fn entry(zone: u32, key: CtKey, expires: u64) -> Entry {
        Entry {
            zone,
            key,
            expires,
            state: CtState::Unreplied,
            ..EMPTY
        }
    }

    #[test]
    fn both_directions_find_one_entry() {
        let t = CtTable::new(100, 4, 3);
        assert_eq!(t.hash(&key(1, 9)), t.hash(&key(1, 9).reversed()));
        assert_ne!(t.hash(&key(1, 9)), t.hash(&key(1, 10)));
        t.insert(entry(1, key(1, 9), 100), 0, None).unwrap();
        assert_eq!(
            t.with(1, &key(1, 9), 0, |_, d, _| (d, false)),
            Some(Dir::Original)
        );
        assert_eq!(
            t.with(1, &key(1, 9).reversed(), 0, |_, d, _| (d, false)),
            Some(Dir::Reply)
        );
        assert_eq!(t.with(2, &key(1, 9), 0, |_, d, _| (d, false)), None);
        assert_eq!(t.with(1, &key(1, 10), 0, |_, d, _| (d, false)), None);
        // Expired: gone.
        assert_eq!(t.with(1, &key(1, 9), 100, |_, d, _| (d, false)), None);
        assert!(t.is_empty());
    }

    #[test]
    fn expire_removes_what_expired_and_keeps_counts() {
        // More entries than a chunk of slots, over few shards, half of them expiring.
        let t = CtTable::new(4 * SCAN_CHUNK as u32, 2, 3);
        let n = 3 * SCAN_CHUNK as u16;
        let rule = RuleRef { group: 0, index: 0 };
        for i in 0..n {
            let expires = if i % 2 == 0 { 10 } else { 100 };
            let (h, k) = (t.hash(&key(1, i)), key(1, i));
            let slot = t.insert(entry(1, k, expires), 0, None).unwrap().unwrap();
            // A third of them shared with zone 2.
            if i % 3 == 0 {
                assert_eq!(t.attach(h, slot, &k, 2, rule, 0, None), Some(Ok(())));
            }
        }
        let shared_even = (0..n).filter(|i| i % 6 == 0).count() as u32;
        assert_eq!(t.len(), u32::from(n));
        // One of the short ones renewed before the sweep: it stays.
        t.with(1, &key(1, 0), 5, |e, _, _| {
            e.expires = 100;
            ((), false)
        });
        let before = t.generation();
        assert_eq!(t.expire(50), u32::from(n) / 2 - 1);
        assert!(t.generation() > before);
        assert_eq!(t.len(), u32::from(n) / 2 + 1);
        assert_eq!(t.zone_len(1), u32::from(n) / 2 + 1);
        assert_eq!(
            t.zone_len(2),
            (0..n).filter(|i| i % 3 == 0).count() as u32 - shared_even + 1
        );
        // What is left is found, what went is not, and the slots are reused.
        assert!(t.with(1, &key(1, 0), 50, |_, _, _| ((), false)).is_some());
        assert!(t.with(1, &key(1, 1), 50, |_, _, _| ((), false)).is_some());
        assert!(t.with(1, &key(1, 2), 50, |_, _, _| ((), false)).is_none());
        assert_eq!(t.expire(50), 0);
        assert_eq!(t.expire(100), u32::from(n) / 2 + 1);
        assert_eq!((t.len(), t.zone_len(1), t.zone_len(2)), (0, 0, 0));
        t.insert(entry(1, key(1, 2), 200), 100, None)
            .unwrap()
            .unwrap();
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn prefault_backs_the_next_slots_and_keeps_entries() {
        let t = CtTable::new(1 << 16, 4, 1);
        // Nothing handed out: a page's worth per shard is asked for.
        assert!(t.prefault() >= 4 * 4096);
        for i in 0..2000u16 {
            t.insert(entry(0, key((i % 200) as u8, i), 100), 0, None)
                .unwrap();
        }
        // The shards grew: twice what they took is asked for ahead of them.
        let asked = t.prefault();
        assert!(
            asked >= 2 * 2000 * std::mem::size_of::<Entry>() - 4 * 4096,
            "{asked}"
        );
        // Nothing grew since: nothing more.
        assert_eq!(t.prefault(), 0);
        assert_eq!(t.len(), 2000);
        for i in 0..2000u16 {
            assert!(t
                .with(0, &key((i % 200) as u8, i), 0, |_, _, _| ((), false))
                .is_some());
        }
    }

    #[test]
    fn limit_and_reuse() {
        let t = CtTable::new(50, 4, 1);
        for i in 0..50u16 {
            t.insert(entry(0, key(1, i), 10), 0, None).unwrap();
        }
        assert_eq!(
            t.insert(entry(0, key(2, 1), 10), 0, None),
            Err(Full::Switch)
        );
        assert_eq!(t.len(), 50);
        // Removing one makes room for one.
        assert_eq!(t.with(0, &key(1, 3), 0, |_, _, _| ((), true)), Some(()));
        t.insert(entry(0, key(2, 1), 10), 0, None).unwrap();
        let mut n = 0;
        t.for_each(0, |_| {
            n += 1;
            true
        });
        assert_eq!(n, 50);
        // A flush of what matches, then expiry of the rest.
        assert_eq!(t.zone_len(0), 50);
        assert_eq!(t.sweep(0, Some(&|e: &Entry| e.key.src < 10)), 10);
        assert_eq!(t.len(), 40);
        assert_eq!(t.sweep(10, None), 40);
        assert_eq!(t.zone_len(0), 0);
        // A zone's own limit.
        t.insert(entry(0, key(1, 1), 10), 0, Some(1)).unwrap();
        assert_eq!(
            t.insert(entry(0, key(1, 2), 10), 0, Some(1)),
            Err(Full::Zone)
        );
        assert_eq!((t.len(), t.zone_len(0)), (1, 1));
        assert!(t.memory_bytes() >= t.capacity() * std::mem::size_of::<Entry>());
    }
}
