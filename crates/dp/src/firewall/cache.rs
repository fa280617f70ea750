//! A worker's verdict cache for tracked UDP connections (docs/firewall.md, "Verdict
//! cache"): in front of the connection table, a frame of a connection this worker saw
//! tracked (UDP, IPv4, untagged: the frames [`qswitch_wire::ct::parse_v4_fast`] takes) is
//! allowed from a direct-mapped slot keyed by its header words, its port and direction,
//! without the keyed hash, the shard's lock or the chain walk.
//!
//! Exactness: a slot holds what the full path found ([`Seen`]: the entry's slot, zones,
//! rules, direction and state) for a tracked UDP frame. A later frame of the same key
//! and direction leaves the connection as it is (`Unreplied` stays so for the original
//! direction, `Replied` for both); the one UDP state change, the first reply, and
//! everything else that could change the verdict bump the table's generation
//! ([`CtTable::bump`]: a connection replied, an entry removed, expired, flushed or left
//! by a zone, a rule set put in force), which a worker reads once per burst
//! ([`VerdictCache::begin`]): a slot of an older generation is a miss. Expiry: a slot is
//! good for at most [`REFRESH`] (and half the state's UDP timeout) after the full path last moved
//! the entry's expiry on, so the entry is alive whenever the slot answers, and the full
//! path refreshes it once per [`REFRESH`] per flow. TCP, ICMP, IPv6 and VLAN-tagged
//! frames and `trace` never use it.

use qswitch_api::config::RuleDirection;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Allowed, CtTable, Firewall, RuleSet, Seen, Verdict};

/// How long a slot answers before the full path refreshes the entry's expiry.
pub const REFRESH: u64 = super::SEC;

/// Slots per worker (a power of two): 10 000 flows both ways fit with room to spare.
const BITS: u32 = 15;
const SLOTS: usize = 1 << BITS;

#[derive(Clone, Copy)]
struct Slot {
    /// The frame's addresses (bytes 26..34).
    addrs: u64,
    /// Its ports (bytes 34..38), its zone and direction.
    rest: u64,
    /// The table's generation when filled; 0: empty.
    generation: u64,
    /// Good while `now` is below this.
    until: u64,
    seen: Seen,
}

const EMPTY: Slot = Slot {
    addrs: 0,
    rest: 0,
    generation: 0,
    until: 0,
    seen: Seen::NONE,
};

/// One worker's cache. Empty (nothing allocated) until its first fill, so a switch
/// without security groups holds none.
#[derive(Default)]
pub struct VerdictCache {
    slots: Vec<Slot>,
    /// The table's generation read at the start of this burst.
    generation: u64,
    /// The rules in force (with their [`Firewall`]'s version), for the checks that miss:
    /// reloaded at the start of a burst only when a rule set was put in force since,
    /// where loading them from the firewall costs a load per frame.
    rules: Option<(u64, Arc<RuleSet>)>,
    /// Checks of this burst that missed (went to the table).
    misses: u32,
    /// Those of the burst before: [`Firewall::prefetch_cached`] looks ahead only when
    /// they were many.
    last_misses: u32,
    /// The key hashes [`Firewall::prefetch_cached`] computed for this burst's frames (by
    /// index), valid where `ahead_on` has the frame's bit: the check does not hash again.
    ahead: [u64; super::BURST],
    ahead_on: u32,
}

/// Misses in a burst from which the next burst's connections are prefetched.
const PREFETCH_AFTER: u32 = 8;

/// The cache key of a frame the short parse takes as UDP (the same tests as
/// [`qswitch_wire::ct::parse_v4_fast`]), crossing `zone` in `direction`.
#[inline]
fn key(frame: &[u8], zone: u32, direction: RuleDirection) -> Option<(u64, u64)> {
    let h: &[u8; 42] = frame.get(..42)?.try_into().ok()?;
    let total = usize::from(u16::from_be_bytes([h[16], h[17]]));
    if h[12] != 0x08
        || h[13] != 0x00
        || h[14] != 0x45
        || h[23] != 17
        || total < 28
        || u16::from_be_bytes([h[20], h[21]]) & 0x3fff != 0
        || frame.len() - 14 < total
        || zone >= 1 << 31
    {
        return None;
    }
    let addrs = u64::from_le_bytes([h[26], h[27], h[28], h[29], h[30], h[31], h[32], h[33]]);
    let ports = u64::from(u32::from_le_bytes([h[34], h[35], h[36], h[37]]));
    let dir = u64::from(direction == RuleDirection::Ingress);
    Some((addrs, ports | u64::from(zone) << 32 | dir << 63))
}

#[inline]
fn index(addrs: u64, rest: u64) -> usize {
    ((addrs ^ rest.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - BITS)) as usize
}

impl VerdictCache {
    /// The slot of key (`addrs`, `rest`) if it holds that key from this burst's generation
    /// (whether it is still in time is the caller's test).
    #[inline]
    fn current(&self, addrs: u64, rest: u64) -> Option<&Slot> {
        self.slots.get(index(addrs, rest)).filter(|s| {
            s.addrs == addrs
                && s.rest == rest
                && s.generation == self.generation
                && self.generation != 0
        })
    }

    /// At the start of a burst of a filtered port: the table's generation now.
    #[inline]
    pub fn begin(&mut self, fw: &Firewall) {
        self.last_misses = std::mem::take(&mut self.misses);
        self.ahead_on = 0;
        self.generation = fw.table.get().map_or(0, CtTable::generation);
        let version = fw.rules_version.load(Ordering::Acquire);
        if self.rules.as_ref().map(|r| r.0) != Some(version) {
            self.rules = Some((version, fw.rules.load_full()));
        }
    }

    /// Empties the cache (tests; a worker's cache empties itself by generation).
    pub fn clear(&mut self) {
        self.slots.clear();
    }
}

impl Firewall {
    /// Before the checks of a burst of `n` frames (`frame(i)`) through `cache`
    /// ([`Firewall::check_cached`], [`VerdictCache::begin`] called): when the burst before
    /// missed the cache often (new connections, more connections than it holds, TCP), asks
    /// the CPU for the bucket heads, then the first entries, of this burst's connections
    /// that miss it, as [`Firewall::check_burst`] does, so that in a big table their cache
    /// misses overlap instead of stalling the checks one after another. A burst of cached
    /// connections pays one comparison.
    #[inline]
    pub fn prefetch_cached<'a>(
        &self,
        cache: &mut VerdictCache,
        zone: u32,
        direction: RuleDirection,
        n: usize,
        frame: impl Fn(usize) -> &'a [u8],
    ) {
        if cache.last_misses < PREFETCH_AFTER {
            return;
        }
        self.prefetch_misses(cache, zone, direction, n, frame);
    }

    #[inline(never)]
    fn prefetch_misses<'a>(
        &self,
        cache: &mut VerdictCache,
        zone: u32,
        direction: RuleDirection,
        n: usize,
        frame: impl Fn(usize) -> &'a [u8],
    ) {
        let Some(table) = self.table.get() else {
            return;
        };
        let mut on = 0u32;
        for i in 0..n.min(super::BURST) {
            let f = frame(i);
            if key(f, zone, direction).is_some_and(|(a, r)| cache.current(a, r).is_some()) {
                continue;
            }
            let Some(p) = qswitch_wire::ct::parse_v4_fast(f) else {
                continue;
            };
            let h = table.hash(&p.key);
            table.prefetch_bucket(h);
            cache.ahead[i] = h;
            on |= 1 << i;
        }
        cache.ahead_on = on;
        let mut rest = on;
        while rest != 0 {
            let i = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            table.prefetch_entry(cache.ahead[i]);
        }
    }

    /// [`Firewall::check_seen`] through a worker's `cache` ([`VerdictCache::begin`] called
    /// for this burst): the same verdict and `seen`. (The engine calls
    /// [`Firewall::check_cached_at`].)
    #[cfg(test)]
    pub fn check_cached(
        &self,
        cache: &mut VerdictCache,
        zone: u32,
        direction: RuleDirection,
        frame: &[u8],
        now: u64,
        seen: &mut Seen,
    ) -> Verdict {
        self.check_cached_at(cache, usize::MAX, zone, direction, frame, now, seen)
    }

    /// [`Firewall::check_cached`] of frame `at` of the burst [`Firewall::prefetch_cached`]
    /// was given (the same bytes: nothing writes a frame between the two), whose key's
    /// hash it may have computed already.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn check_cached_at(
        &self,
        cache: &mut VerdictCache,
        at: usize,
        zone: u32,
        direction: RuleDirection,
        frame: &[u8],
        now: u64,
        seen: &mut Seen,
    ) -> Verdict {
        let rules = cache.rules.as_ref().map(|r| &*r.1);
        let hint = (at < super::BURST && cache.ahead_on & (1 << at) != 0).then(|| cache.ahead[at]);
        let Some((addrs, rest)) = key(frame, zone, direction) else {
            cache.misses += 1;
            *seen = Seen::NONE;
            return self.check_once(zone, direction, frame, now, true, false, seen, rules, hint);
        };
        if let Some(s) = cache.current(addrs, rest).filter(|s| now < s.until) {
            if let Some(v) = s.seen.covered(zone) {
                *seen = s.seen;
                return v;
            }
        }
        cache.misses += 1;
        *seen = Seen::NONE;
        let v = self.check_once(zone, direction, frame, now, true, false, seen, rules, hint);
        if let Verdict::Allow(Allowed::Tracked(..), Some(state)) = v {
            if seen.covers(zone) && cache.generation != 0 {
                if cache.slots.is_empty() {
                    cache.slots = vec![EMPTY; SLOTS];
                }
                let life = REFRESH.min(self.timeouts.of(17, state) / 2);
                cache.slots[index(addrs, rest)] = Slot {
                    addrs,
                    rest,
                    generation: cache.generation,
                    until: now.saturating_add(life),
                    seen: *seen,
                };
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firewall::{CtState, Denied, RuleSet, SEC};
    use qswitch_api::config::Config;
    use qswitch_test_support::frames::{ipv4_packet as v4, ipv4_udp as udp, tcp_header};
    use RuleDirection::{Egress, Ingress};

    const VM: [u8; 4] = [10, 0, 0, 5];
    const OUT: [u8; 4] = [192, 0, 2, 1];

    fn tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, flags: u8, seq: u32) -> Vec<u8> {
        v4(src, dst, 6, &tcp_header(sport, dport, flags, seq, 0, 1000))
    }

    fn config(rules: &str) -> Config {
        Config::from_toml(&format!(
            r#"
    [[security_group]]
    name = "g"
    rules = [ {rules} ]
    [[port]]
    name = "vm"
    type = "gen"
    security = {{ ips = ["10.0.0.5"] }}
    security_groups = ["g"]
    "#
        ))
        .unwrap()
    }

    const RULES: &str =
        r#"{ direction = "egress" }, { direction = "ingress", protocol = "udp", ports = "7" },"#;

    /// Whether `frame` would be answered from `cache` now.
    fn cached(cache: &VerdictCache, frame: &[u8], dir: RuleDirection, now: u64) -> bool {
        key(frame, 0, dir)
            .and_then(|(a, r)| cache.current(a, r))
            .is_some_and(|s| now < s.until)
    }

    /// What a check found, without the table's own slot and hash (which differ between
    /// two tables).
    fn found(
        s: Seen,
    ) -> (
        u32,
        u32,
        super::super::RuleRef,
        super::super::RuleRef,
        bool,
        CtState,
    ) {
        (s.zone, s.peer, s.rule, s.peer_rule, s.reply, s.state)
    }

    /// Two firewalls of [`RULES`]: one checked through a cache, one plainly.
    fn twins() -> (Firewall, Firewall, VerdictCache) {
        let cfg = config(RULES);
        let fw = |c| Firewall::from_config(c).unwrap();
        (fw(&cfg), fw(&cfg), VerdictCache::default())
    }

    #[test]
    fn hits_answer_as_the_full_path() {
        let (fw, plain, mut cache) = twins();
        let mut frames = vec![
            // Unreplied for 10 rounds, then replied.
            (Egress, udp(VM, OUT, 6000, 53)),
            (Egress, udp(VM, OUT, 5000, 53)),
            (Ingress, udp(OUT, VM, 53, 5000)),
            (Egress, udp(VM, OUT, 5001, 53)),
            (Ingress, udp(OUT, VM, 53, 5002)),
            (Ingress, udp(OUT, VM, 9, 7)),
            (Egress, udp(VM, OUT, 7, 9)),
            (Egress, tcp(VM, OUT, 40000, 80, 0x02, 100)),
            (Ingress, tcp(OUT, VM, 80, 40000, 0x12, 500)),
            (Ingress, tcp(OUT, VM, 80, 40001, 0x10, 500)),
            (Egress, v4(VM, OUT, 1, &[8, 0, 0, 0, 0, 1, 0, 1])),
            (Ingress, v4(OUT, VM, 1, &[0, 0, 0, 0, 0, 1, 0, 1])),
        ];
        let mut hits = 0;
        for round in 0..20u64 {
            let now = SEC + round * SEC / 4;
            if round == 10 {
                frames.push((Ingress, udp(OUT, VM, 53, 6000)));
            }
            cache.begin(&fw);
            for (dir, f) in &frames {
                hits += u32::from(cached(&cache, f, *dir, now));
                let (mut s1, mut s2) = (Seen::NONE, Seen::NONE);
                let v1 = fw.check_cached(&mut cache, 0, *dir, f, now, &mut s1);
                let v2 = plain.check_seen(0, *dir, f, now, &mut s2);
                assert_eq!(v1, v2, "round {round}, {dir:?} {f:?}");
                assert_eq!(found(s1), found(s2), "round {round}");
            }
        }
        // The tracked UDP frames hit between refreshes (once a second) and changes.
        assert!(hits >= 60, "{hits} hits");
        let counts = |fw: &Firewall| {
            let z = fw.zone(0).unwrap();
            let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            (
                n(&z.new),
                n(&z.ct_invalid),
                n(&z.ct_limit),
                n(&z.ct_fragment),
            )
        };
        assert_eq!(counts(&fw), counts(&plain));
        assert_eq!(fw.stats().rules, plain.stats().rules);
        assert_eq!(fw.table().len(), plain.table().len());
    }

    #[test]
    fn prefetched_bursts_answer_as_the_full_path() {
        // Bursts of new connections (so each burst after the first looks ahead and hands
        // its hashes to the checks), replies, TCP and ICMP among them.
        let (fw, plain, mut cache) = twins();
        let mut looked_ahead = 0;
        for round in 0..6u16 {
            let now = SEC + u64::from(round) * SEC / 4;
            let mut burst: Vec<(RuleDirection, Vec<u8>)> = (0..24)
                .map(|k| (Egress, udp(VM, OUT, 1000 + round * 100 + k, 53)))
                .collect();
            burst.push((Egress, tcp(VM, OUT, 40000 + round, 80, 0x02, 100)));
            burst.push((Egress, tcp(VM, OUT, 41000, 80, 0x10, 100)));
            burst.push((Egress, v4(VM, OUT, 1, &[8, 0, 0, 0, 0, 1, 0, 1])));
            burst.push((Egress, b"not even ethernet".to_vec()));
            if round > 0 {
                // The last round's first flows again (tracked now), twice.
                for k in 0..2 {
                    burst.push((Egress, udp(VM, OUT, 1000 + (round - 1) * 100 + k, 53)));
                    burst.push((Egress, udp(VM, OUT, 1000 + (round - 1) * 100 + k, 53)));
                }
            }
            cache.begin(&fw);
            fw.prefetch_cached(&mut cache, 0, Egress, burst.len(), |i| &burst[i].1);
            looked_ahead += cache.ahead_on.count_ones();
            for (i, (dir, f)) in burst.iter().enumerate() {
                let (mut s1, mut s2) = (Seen::NONE, Seen::NONE);
                let v1 = fw.check_cached_at(&mut cache, i, 0, *dir, f, now, &mut s1);
                let v2 = plain.check_seen(0, *dir, f, now, &mut s2);
                assert_eq!(v1, v2, "round {round}, frame {i}");
                assert_eq!(found(s1), found(s2), "round {round}, frame {i}");
            }
        }
        // Rounds 1..6 looked ahead for their new UDP and TCP frames at least.
        assert!(looked_ahead >= 5 * 26, "{looked_ahead}");
        assert_eq!(fw.table().len(), plain.table().len());
        assert_eq!(fw.stats().rules, plain.stats().rules);
    }

    #[test]
    fn changes_end_cached_verdicts() {
        let fw = Firewall::from_config(&config(RULES)).unwrap();
        let mut cache = VerdictCache::default();
        let out = udp(VM, OUT, 5000, 53);
        let back = udp(OUT, VM, 53, 5000);
        let check = |cache: &mut VerdictCache, f: &[u8], dir, now| {
            cache.begin(&fw);
            fw.check_cached(cache, 0, dir, f, now, &mut none())
        };
        assert!(check(&mut cache, &out, Egress, SEC).allowed());
        assert!(check(&mut cache, &back, Ingress, SEC).allowed());
        assert!(check(&mut cache, &out, Egress, SEC).allowed());
        // The first reply changed the state (a new generation): filled again now.
        assert!(check(&mut cache, &back, Ingress, SEC).allowed());
        assert!(cached(&cache, &back, Ingress, SEC) && cached(&cache, &out, Egress, SEC));

        // A flush: the reply is a new connection for the ingress rules, which refuse it.
        fw.flush(None, SEC);
        cache.begin(&fw);
        assert!(!cached(&cache, &back, Ingress, SEC));
        assert_eq!(
            check(&mut cache, &back, Ingress, SEC),
            Verdict::Deny(Denied::NoRule(Ingress), None)
        );

        // Tracked again, then the egress rule removed: the connection ends.
        assert!(check(&mut cache, &out, Egress, 2 * SEC).allowed());
        assert!(check(&mut cache, &back, Ingress, 2 * SEC).allowed());
        assert!(check(&mut cache, &back, Ingress, 2 * SEC).allowed());
        assert!(cached(&cache, &back, Ingress, 2 * SEC));
        let ingress_only = config(r#"{ direction = "ingress", protocol = "udp", ports = "7" },"#);
        fw.set_rules(RuleSet::compile(&ingress_only));
        cache.begin(&fw);
        assert!(!cached(&cache, &back, Ingress, 2 * SEC));
        assert_eq!(
            check(&mut cache, &back, Ingress, 2 * SEC),
            Verdict::Deny(Denied::NoRule(Ingress), None)
        );
        assert_eq!(
            check(&mut cache, &out, Egress, 2 * SEC),
            Verdict::Deny(Denied::NoRule(Egress), None)
        );

        // Back to the first rules; an entry removed by expiry ends its slot too.
        fw.set_rules(RuleSet::compile(&config(RULES)));
        assert!(check(&mut cache, &out, Egress, 3 * SEC).allowed());
        assert!(check(&mut cache, &back, Ingress, 3 * SEC).allowed());
        assert!(check(&mut cache, &back, Ingress, 3 * SEC).allowed());
        let late = 3 * SEC + fw.timeouts().udp_replied;
        assert_eq!(fw.expire(late), 1);
        cache.begin(&fw);
        assert!(!cached(&cache, &back, Ingress, 3 * SEC));
        assert!(!check(&mut cache, &back, Ingress, late).allowed());
    }

    fn none() -> Seen {
        Seen::NONE
    }

    #[test]
    fn hits_keep_the_connection_alive_and_trace_never_fills() {
        let fw = Firewall::from_config(&config(RULES)).unwrap();
        let mut cache = VerdictCache::default();
        let out = udp(VM, OUT, 5000, 53);
        let back = udp(OUT, VM, 53, 5000);
        cache.begin(&fw);
        assert!(fw
            .check_cached(&mut cache, 0, Egress, &out, SEC, &mut none())
            .allowed());
        assert!(fw
            .check_cached(&mut cache, 0, Ingress, &back, SEC, &mut none())
            .allowed());
        // Twice the replied timeout of replies only, every 100 ms, mostly from the cache:
        // the full path refreshes the entry once a second, so it never expires.
        let mut hits = 0;
        let mut now = SEC;
        while now < SEC + 2 * fw.timeouts().udp_replied {
            now += SEC / 10;
            if now.is_multiple_of(10 * SEC) {
                assert_eq!(fw.expire(now), 0);
            }
            cache.begin(&fw);
            hits += u32::from(cached(&cache, &back, Ingress, now));
            let v = fw.check_cached(&mut cache, 0, Ingress, &back, now, &mut none());
            assert!(v.allowed(), "at {now}");
        }
        assert!(hits > 2000, "{hits}");
        assert_eq!(
            std::mem::size_of::<Slot>(),
            64,
            "docs/firewall.md says 2 MiB"
        );
        // A dry run neither asks nor fills the cache.
        let fresh = udp(VM, OUT, 6000, 53);
        assert!(fw.peek(0, Egress, &fresh, now).allowed());
        assert!(!cached(&cache, &fresh, Egress, now));
    }
}
