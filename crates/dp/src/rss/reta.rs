//! The RSS indirection table: hash → queue.
//!
//! [`RETA_SIZE`] (128) entries, the size Microsoft's RSS and the virtio-net minimum
//! (`rss_max_indirection_table_length >= 128`) use. A hash picks entry `hash & 127`; the entry
//! names the queue. The enabled queues are spread over the entries round-robin, so with `n`
//! queues each gets `128 / n` entries, give or take one, and a flow (one hash) always lands on
//! the same queue until the enabled set changes.

use std::fmt::Write as _;

/// Entries in the table (a power of two).
pub const RETA_SIZE: usize = 128;

/// An indirection table over a set of enabled queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reta {
    table: [u16; RETA_SIZE],
    /// The enabled queues, ascending, without duplicates.
    enabled: Vec<u16>,
}

impl Default for Reta {
    /// The empty table (see [`Reta::is_empty`]).
    fn default() -> Reta {
        Reta::new(&[])
    }
}

impl Reta {
    /// A table spreading `enabled` round-robin over the entries: entry `i` holds the
    /// `i % n`-th enabled queue. The set is sorted and deduplicated first, so the table depends
    /// only on the set, not on how it was listed; with more than [`RETA_SIZE`] queues, only the
    /// lowest [`RETA_SIZE`] get an entry. With no enabled queue, every entry holds
    /// queue 0 and [`Reta::is_empty`] is true: the caller must not deliver.
    pub fn new(enabled: &[u16]) -> Reta {
        let mut reta = Reta {
            table: [0; RETA_SIZE],
            enabled: Vec::new(),
        };
        reta.set_enabled(enabled);
        reta
    }

    /// Rebuilds the table for a new enabled set (as [`Reta::new`]). A hash may move to another
    /// queue; no hash maps to a queue outside the new set.
    pub fn set_enabled(&mut self, enabled: &[u16]) {
        let mut set = enabled.to_vec();
        set.sort_unstable();
        set.dedup();
        if set.is_empty() {
            self.table = [0; RETA_SIZE];
        } else {
            for (i, entry) in self.table.iter_mut().enumerate() {
                *entry = set[i % set.len()];
            }
        }
        self.enabled = set;
    }

    /// The queue of a hash: entry `hash & 127`.
    #[inline]
    pub fn queue_for(&self, hash: u32) -> u16 {
        // The mask keeps the index below RETA_SIZE; the cast cannot truncate.
        self.table[(hash as usize) & (RETA_SIZE - 1)]
    }

    /// The queue for traffic that is not hashed (not IP): always the first enabled queue (0
    /// when none is enabled).
    #[inline]
    pub fn queue_for_non_ip(&self) -> u16 {
        self.enabled.first().copied().unwrap_or(0)
    }

    /// The enabled queues, ascending.
    pub fn queues(&self) -> &[u16] {
        &self.enabled
    }

    /// No queue is enabled: nothing may be delivered.
    pub fn is_empty(&self) -> bool {
        self.enabled.is_empty()
    }

    /// The entries.
    pub fn table(&self) -> &[u16; RETA_SIZE] {
        &self.table
    }

    /// The table as text: 8 rows of 16 entries, each row led by its first index.
    ///
    /// ```text
    ///   0: 0 1 2 3 0 1 2 3 0 1 2 3 0 1 2 3
    ///  16: 0 1 2 3 ...
    /// ```
    pub fn render(&self) -> String {
        let width = self
            .table
            .iter()
            .map(|q| q.to_string().len())
            .max()
            .unwrap_or(1);
        let mut out = String::new();
        for (row, entries) in self.table.chunks(16).enumerate() {
            let _ = write!(out, "{:3}:", row * 16);
            for q in entries {
                let _ = write!(out, " {q:>width$}");
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counts(reta: &Reta) -> std::collections::BTreeMap<u16, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for &q in reta.table() {
            *counts.entry(q).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn round_robin_over_the_enabled_set() {
        let reta = Reta::new(&[3, 1, 2, 0, 1]);
        assert_eq!(reta.queues(), &[0, 1, 2, 3]);
        assert_eq!(&reta.table()[..6], &[0, 1, 2, 3, 0, 1]);
        assert_eq!(reta.queue_for(5), 1);
        assert_eq!(reta.queue_for(128 + 5), 1);
        assert_eq!(reta.queue_for(u32::MAX), 3);
        assert_eq!(reta.queue_for_non_ip(), 0);
        assert!(!reta.is_empty());
        assert!(counts(&reta).values().all(|&n| n == 32));
    }

    #[test]
    fn empty_set_maps_to_queue_zero_and_says_so() {
        let mut reta = Reta::new(&[2, 5]);
        reta.set_enabled(&[]);
        assert!(reta.is_empty());
        assert!(reta.table().iter().all(|&q| q == 0));
        assert_eq!(reta.queue_for(0xdead_beef), 0);
        assert_eq!(reta.queue_for_non_ip(), 0);
        assert_eq!(Reta::default(), Reta::new(&[]));
    }

    #[test]
    fn non_ip_goes_to_the_first_enabled_queue() {
        let mut reta = Reta::new(&[7, 4, 9]);
        assert_eq!(reta.queue_for_non_ip(), 4);
        reta.set_enabled(&[9]);
        assert_eq!(reta.queue_for_non_ip(), 9);
    }

    #[test]
    fn render_is_8_rows_of_16() {
        let reta = Reta::new(&[0, 1, 2, 10]);
        let text = reta.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8);
        assert_eq!(
            lines[0],
            "  0:  0  1  2 10  0  1  2 10  0  1  2 10  0  1  2 10"
        );
        assert!(lines[7].starts_with("112:"));
        for line in lines {
            assert_eq!(line.split_whitespace().count(), 17);
        }
    }

    proptest! {
        #[test]
        fn stable_and_balanced(
            enabled in prop::collection::vec(0u16..64, 1..40),
            hashes in prop::collection::vec(any::<u32>(), 1..50),
        ) {
            let reta = Reta::new(&enabled);
            for &h in &hashes {
                let q = reta.queue_for(h);
                prop_assert_eq!(q, reta.queue_for(h));
                prop_assert!(reta.queues().contains(&q));
            }
            let counts = counts(&reta);
            prop_assert_eq!(counts.len(), reta.queues().len().min(RETA_SIZE));
            let min = counts.values().min().unwrap();
            let max = counts.values().max().unwrap();
            prop_assert!(max - min <= 1, "{counts:?}");
        }

        #[test]
        fn changing_the_set_never_maps_to_a_disabled_queue(
            sets in prop::collection::vec(prop::collection::vec(0u16..16, 0..10), 1..6),
            hash in any::<u32>(),
        ) {
            let mut reta = Reta::new(&sets[0]);
            for set in &sets {
                reta.set_enabled(set);
                prop_assert_eq!(&reta, &Reta::new(set));
                if set.is_empty() {
                    prop_assert!(reta.is_empty());
                } else {
                    prop_assert!(set.contains(&reta.queue_for(hash)));
                    prop_assert!(reta.table().iter().all(|q| set.contains(q)));
                    prop_assert!(set.contains(&reta.queue_for_non_ip()));
                }
            }
        }
    }
}
