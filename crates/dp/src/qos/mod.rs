//! Port QoS: minimum guarantees, maximum limits and weights, without starvation.
//!
//! ```text
//!  control plane (thread qs-qos, every TICK = 10 ms)          workers (per rx burst)
//!  ─────────────────────────────────────────────────          ──────────────────────
//!  per port: wire bytes, throttled polls since last tick       budget = rx_budget(q, now)
//!    → measured rate (EWMA), demand estimate                     0 → port not polled
//!  per uplink: a_i = min(d_i, max_i, max(min_i, w_i·L))          n = rx_burst(.., ≤ budget)
//!    (control::qos::alloc, water-filling for L)                charge(q, frames): wire bytes
//!  publish a_i → PortQos::rate (one atomic store)  ──────────▶   taken from the port's bucket
//! ```
//!
//! # Where it is enforced
//! At ingress, per source port: the ports of a VLAN that has an uplink (a port with a
//! `capacity`) share that capacity by the allocation rule, and each one's token bucket is
//! refilled at its allocation. Since Σ a_i ≤ C, the uplink's egress stays within its
//! capacity without a queue of its own. A port out of tokens is simply not polled
//! (back-pressure): a vhost-user guest's ring fills and the guest slows down; a TAP's kernel
//! queue fills and the sender's TCP stack (TCP small queues) waits, exactly as on a slow NIC.
//! No frame is dropped for lack of tokens, and nothing is queued inside the switch, so a
//! settings change never reorders a port's frames (its frames take the same single path at
//! any rate).
//!
//! # Demand
//! A port that ran out of tokens during a tick, or used ≥ 90% of its allocation, is taken to
//! want more: its demand becomes `max(1.25 × a, a + C/50)`, so allocations grow within a few
//! ticks. Otherwise its demand is 1.25 × its measured rate (EWMA), at least C/100, so what it
//! does not use goes to the others (work conservation).
//!
//! # Metering
//! Rates are bits/s of L2 frames: the Ethernet header counts, the FCS does not, and a TSO
//! segment counts as the frames it becomes on the wire (`VirtioNetHdr::wire_frames`).
//!
//! # Limitations
//! - Everything a port sends counts against its allocation, also traffic to ports other than
//!   the uplink (in the same VLAN).
//! - A port is toward every uplink it shares a VLAN with (native or tagged, on either side:
//!   a trunk uplink serves the ports of all the VLANs it carries), is admitted against each,
//!   and gets one allocation: the smallest of its shares of them.
//! - A port's allocation is shared by all its rx queues through one lock-free bucket.
//! - Traffic arriving on the uplink (toward the ports) is not shaped.

pub mod token_bucket;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use qswitch_api::{PortConfig, QosSettings};

use crate::packet::Pkt;
use crate::stats::Counter;
use token_bucket::TokenBucket;

/// Rate of a port that is not shaped.
pub const UNLIMITED: u64 = u64::MAX;
/// How often the allocator runs.
pub const TICK: Duration = Duration::from_millis(10);
/// Seconds of per-second rates kept per port.
pub const HISTORY: usize = 300;
/// Lowest rate ever published to a shaped port, so its bucket always refills.
pub(crate) const MIN_RATE: u64 = 8_000;
/// Bucket depth: this much time at the allocated rate, but at least [`MIN_DEPTH`] bytes. A
/// worker or sender that lost its CPU for up to this long catches up afterwards.
const DEPTH_NS: u64 = 40_000_000;
/// Three TSO segments.
const MIN_DEPTH: u64 = 3 * 65_536;
/// Frames admitted per poll per this many bytes of tokens (the size of a TSO segment).
const BUDGET_BYTES: u64 = 65_536;

/// Bucket depth in bytes for `rate_bps`.
#[inline]
fn depth(rate_bps: u64) -> u64 {
    ((u128::from(rate_bps) * u128::from(DEPTH_NS) / 8_000_000_000) as u64).max(MIN_DEPTH)
}

/// The QoS state of one port.
#[derive(Debug)]
pub struct PortQos {
    /// The allocation in bits/s ([`UNLIMITED`]: not shaped). Written by the allocator only.
    pub(crate) rate: AtomicU64,
    bucket: TokenBucket,
    /// Wire bytes received, per rx queue (single writer: the queue's worker).
    wire_bytes: Box<[Counter]>,
    /// Polls skipped for lack of tokens, per rx queue (single writer: the queue's worker).
    pub(crate) throttled: Box<[Counter]>,
    /// Uplink capacity, bits/s.
    pub(crate) capacity: Option<u64>,
    /// Live settings (control plane only; workers never take this lock).
    pub(crate) settings: Mutex<QosSettings>,
    /// The allocator's bookkeeping (allocator and `qos show` only).
    pub(crate) state: Mutex<AllocState>,
}

/// The allocator's bookkeeping of one port (the control side's `control::qos` keeps it).
#[derive(Debug, Default)]
pub(crate) struct AllocState {
    pub(crate) last_bytes: u64,
    pub(crate) last_throttled: u64,
    pub(crate) ewma_bps: f64,
    pub(crate) demand: f64,
    pub(crate) alloc: Option<u64>,
    pub(crate) second_bytes: u64,
    pub(crate) second_at: u64,
    pub(crate) rate_bps: f64,
    pub(crate) alloc_last_second: Option<u64>,
    pub(crate) history: VecDeque<f64>,
    /// The one-second sample (`QosShared::seconds` after it) that `history` ends with, if
    /// any: seconds the allocator skipped as idle since are zeros not stored (see
    /// `AllocState::history_at`).
    pub(crate) history_to: Option<u64>,
    /// The allocator tick that last measured this port (0: never).
    pub(crate) measured_tick: u64,
}

impl AllocState {
    /// Appends one second's rate `r` as second `second`, after the zeros of the seconds the
    /// allocator skipped since the last one it stored (every port was idle then).
    pub(crate) fn push_history(&mut self, second: u64, r: f64) {
        let skipped = self.history_to.map_or(0, |t| second.saturating_sub(t + 1));
        for _ in 0..skipped.min(HISTORY as u64) {
            self.push_one(0.0);
        }
        self.push_one(r);
        self.history_to = Some(second);
    }

    fn push_one(&mut self, r: f64) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(r);
    }

    /// The history as of second `now` (`QosShared::seconds`): what is stored, then a zero
    /// for each second skipped since, at most [`HISTORY`] values.
    pub(crate) fn history_at(&self, now: u64) -> Vec<f64> {
        let skipped = self.history_to.map_or(0, |t| now.saturating_sub(t)) as usize;
        let skipped = skipped.min(HISTORY);
        let kept = self.history.len().min(HISTORY - skipped);
        let mut v: Vec<f64> = self
            .history
            .iter()
            .skip(self.history.len() - kept)
            .copied()
            .collect();
        v.resize(kept + skipped, 0.0);
        v
    }
}

impl PortQos {
    /// QoS state for a new port (settings from its config; bad settings were refused by
    /// validation, so they fall back to the defaults here).
    pub fn new(config: &PortConfig, now: u64) -> PortQos {
        let queues = usize::from(config.queues);
        PortQos {
            rate: AtomicU64::new(UNLIMITED),
            bucket: TokenBucket::new(MIN_DEPTH, now),
            wire_bytes: (0..queues).map(|_| Counter::default()).collect(),
            throttled: (0..queues).map(|_| Counter::default()).collect(),
            capacity: config.capacity_bps(),
            settings: Mutex::new(config.qos_settings()),
            state: Mutex::new(AllocState {
                second_at: now,
                ..AllocState::default()
            }),
        }
    }

    /// Before polling rx queue `queue`: how many frames (≤ `max`) may be read now. 0 means
    /// the port is out of tokens and must not be polled (back-pressure).
    #[inline]
    pub fn rx_budget(&self, queue: u16, now: u64, max: usize) -> usize {
        let rate = self.rate.load(Ordering::Relaxed);
        if rate == UNLIMITED {
            return max;
        }
        self.bucket.refill(now, rate, depth(rate));
        let t = self.bucket.available();
        if t <= 0 {
            if let Some(c) = self.throttled.get(usize::from(queue)) {
                c.add(1);
            }
            return 0;
        }
        ((t as u64).div_ceil(BUDGET_BYTES) as usize).clamp(1, max)
    }

    /// After a poll of `queue` brought in `pkts`: counts their wire bytes and charges them
    /// to the bucket when the port is shaped.
    #[inline]
    pub fn charge(&self, queue: u16, pkts: &[Pkt]) {
        if pkts.is_empty() {
            return;
        }
        let bytes: u64 = pkts.iter().map(|p| p.hdr.wire_frames(p.frame()).1).sum();
        if let Some(c) = self.wire_bytes.get(usize::from(queue)) {
            c.add(bytes);
        }
        if self.rate.load(Ordering::Relaxed) != UNLIMITED {
            self.bucket.take(bytes);
        }
    }

    /// When the port is out of tokens: nanoseconds until it may be polled again.
    #[inline]
    pub fn wait_ns(&self) -> Option<u64> {
        let rate = self.rate.load(Ordering::Relaxed);
        if rate == UNLIMITED || self.bucket.available() > 0 {
            return None;
        }
        Some(self.bucket.ns_until_positive(rate))
    }

    /// The current allocation, bits/s (`None`: not shaped).
    pub fn rate(&self) -> Option<u64> {
        Some(self.rate.load(Ordering::Relaxed)).filter(|&r| r != UNLIMITED)
    }

    /// Bytes in the token bucket (`None`: not shaped). Read-only (for `trace`).
    pub fn tokens(&self) -> Option<i64> {
        self.rate().map(|_| self.bucket.available())
    }

    /// The live settings.
    pub fn settings(&self) -> QosSettings {
        *self.settings.lock()
    }

    pub(crate) fn wire_total(&self) -> u64 {
        self.wire_bytes.iter().map(Counter::get).sum()
    }
}

/// Switch-wide QoS state.
#[derive(Debug)]
pub(crate) struct QosShared {
    pub(crate) reservable: f64,
    pub(crate) ticks: AtomicU64,
    pub(crate) seconds: AtomicU64,
    /// Bumped by every settings change, so the allocator redoes the rates that only change
    /// with the settings (ports with no uplink) only then.
    pub(crate) settings_gen: AtomicU64,
    /// Set (and the condition variable signalled) when the allocator should look again at
    /// once: the settings or the port table changed, or the switch stops. With no port
    /// toward an uplink the allocator thread sleeps until the next second or this.
    changed: parking_lot::Mutex<bool>,
    changed_cv: parking_lot::Condvar,
}

impl QosShared {
    pub(crate) fn new(reservable: f64) -> QosShared {
        QosShared {
            reservable,
            ticks: AtomicU64::new(0),
            seconds: AtomicU64::new(0),
            settings_gen: AtomicU64::new(0),
            changed: parking_lot::Mutex::new(false),
            changed_cv: parking_lot::Condvar::new(),
        }
    }

    /// Wakes the allocator thread if it sleeps ([`QosShared::wait`]).
    pub(crate) fn notify(&self) {
        *self.changed.lock() = true;
        self.changed_cv.notify_all();
    }

    /// Sleeps for `d` or until [`QosShared::notify`], whichever comes first.
    pub(crate) fn wait(&self, d: std::time::Duration) {
        let mut changed = self.changed.lock();
        if !*changed {
            self.changed_cv.wait_for(&mut changed, d);
        }
        *changed = false;
    }
}

/// A requested settings change (bits/s); `None` fields keep their value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosUpdate {
    pub min: Option<u64>,
    pub max: Option<u64>,
    pub weight: Option<u32>,
    /// Reset everything first.
    pub clear: bool,
}

impl QosUpdate {
    pub(crate) fn apply(&self, old: QosSettings) -> QosSettings {
        let mut s = if self.clear {
            QosSettings::default()
        } else {
            old
        };
        if let Some(m) = self.min {
            s.min = Some(m).filter(|&m| m > 0);
        }
        if let Some(m) = self.max {
            s.max = Some(m);
        }
        if let Some(w) = self.weight {
            s.weight = w;
        }
        s
    }
}
