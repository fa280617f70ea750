//! Port QoS: minimum guarantees, maximum limits and weights, without starvation.
//!
//! ```text
//!  control plane (thread qs-qos, every TICK = 10 ms)          workers (per rx burst)
//!  ─────────────────────────────────────────────────          ──────────────────────
//!  per port: wire bytes, throttled polls since last tick       budget = rx_budget(q, now)
//!    → measured rate (EWMA), demand estimate                     0 → port not polled
//!  per uplink: a_i = min(d_i, max_i, max(min_i, w_i·L))          n = rx_burst(.., ≤ budget)
//!    (alloc::allocate, water-filling for L)                    charge(q, frames): wire bytes
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
//! - A port's allocation is shared by all its rx queues through one lock-free bucket.
//! - Traffic arriving on the uplink (toward the ports) is not shaped.

pub mod alloc;
pub mod token_bucket;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use qswitch_api::config::format_rate;
use qswitch_api::request::{QosPort, QosReport};
use qswitch_api::{PortConfig, QosSettings};

use crate::packet::Pkt;
use crate::stats::Counter;
use crate::switch::{PortEntry, PortTable, Shared};
use alloc::{allocate, Claim};
use token_bucket::TokenBucket;

/// Rate of a port that is not shaped.
pub const UNLIMITED: u64 = u64::MAX;
/// How often the allocator runs.
pub const TICK: Duration = Duration::from_millis(10);
/// Seconds of per-second rates kept per port.
pub const HISTORY: usize = 300;
/// Lowest rate ever published to a shaped port, so its bucket always refills.
const MIN_RATE: u64 = 8_000;
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
    rate: AtomicU64,
    bucket: TokenBucket,
    /// Wire bytes received, per rx queue (single writer: the queue's worker).
    wire_bytes: Box<[Counter]>,
    /// Polls skipped for lack of tokens, per rx queue (single writer: the queue's worker).
    throttled: Box<[Counter]>,
    /// Uplink capacity, bits/s.
    capacity: Option<u64>,
    /// Live settings (control plane only; workers never take this lock).
    settings: Mutex<QosSettings>,
    /// The allocator's bookkeeping (allocator and `qos show` only).
    state: Mutex<AllocState>,
}

#[derive(Debug, Default)]
struct AllocState {
    last_bytes: u64,
    last_throttled: u64,
    ewma_bps: f64,
    demand: f64,
    alloc: Option<u64>,
    second_bytes: u64,
    second_at: u64,
    rate_bps: f64,
    alloc_last_second: Option<u64>,
    history: VecDeque<f64>,
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

    /// The live settings.
    pub fn settings(&self) -> QosSettings {
        *self.settings.lock()
    }

    fn wire_total(&self) -> u64 {
        self.wire_bytes.iter().map(Counter::get).sum()
    }
}

/// Switch-wide QoS state.
#[derive(Debug)]
pub(crate) struct QosShared {
    pub(crate) reservable: f64,
    ticks: AtomicU64,
    seconds: AtomicU64,
    /// Serialises settings changes (admission control sees a stable sum).
    admin: Mutex<()>,
}

impl QosShared {
    pub(crate) fn new(reservable: f64) -> QosShared {
        QosShared {
            reservable,
            ticks: AtomicU64::new(0),
            seconds: AtomicU64::new(0),
            admin: Mutex::new(()),
        }
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
    fn apply(&self, old: QosSettings) -> QosSettings {
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

/// The uplink of `vlan` in `table`: (entry, capacity).
fn uplink_of(table: &PortTable, vlan: u16) -> Option<(&Arc<PortEntry>, u64)> {
    table
        .iter()
        .flatten()
        .find_map(|p| Some((p, p.qos.capacity?)).filter(|(p, _)| p.vlan == vlan))
}

/// Checks the guarantees of `table` (with `name`'s settings replaced by `new`) against
/// every uplink's reservable share. The message says what would be exceeded.
pub(crate) fn admit(
    table: &PortTable,
    reservable: f64,
    changed: Option<(&str, QosSettings)>,
) -> Result<(), String> {
    for up in table.iter().flatten() {
        let Some(cap) = up.qos.capacity else { continue };
        let sum: u64 = table
            .iter()
            .flatten()
            .filter(|p| p.vlan == up.vlan && p.qos.capacity.is_none())
            .map(|p| {
                let s = match changed {
                    Some((n, s)) if n == p.config.name => s,
                    _ => p.qos.settings(),
                };
                s.min.unwrap_or(0)
            })
            .sum();
        let limit = (reservable * cap as f64) as u64;
        if sum > limit {
            return Err(format!(
                "refused: the guarantees toward uplink '{}' would add up to {}, above reservable {reservable} x capacity {} = {}; nothing changed",
                up.config.name,
                format_rate(sum),
                format_rate(cap),
                format_rate(limit)
            ));
        }
    }
    Ok(())
}

/// Applies `update` to port `name` if admission control allows it.
pub(crate) fn set(
    shared: &Shared,
    name: &str,
    update: &QosUpdate,
) -> Result<QosSettings, crate::SwitchError> {
    let _admin = shared.qos.admin.lock();
    let table = shared.ports.load_full();
    let entry = table
        .iter()
        .flatten()
        .find(|p| p.config.name == name)
        .ok_or_else(|| crate::SwitchError::NoSuchPort(name.to_string()))?;
    if entry.qos.capacity.is_some() {
        return Err(crate::SwitchError::Qos(format!(
            "port '{name}' is an uplink (capacity {}); its ports share it, it takes no qos settings",
            format_rate(entry.qos.capacity.unwrap_or(0))
        )));
    }
    let new = update.apply(entry.qos.settings());
    new.check()
        .map_err(|m| crate::SwitchError::Qos(format!("port '{name}': {m}")))?;
    admit(&table, shared.qos.reservable, Some((name, new))).map_err(crate::SwitchError::Qos)?;
    *entry.qos.settings.lock() = new;
    tracing::info!(port = %name, ?new, "qos settings changed");
    Ok(new)
}

/// The allocator thread: runs [`tick`] every [`TICK`] until the switch stops.
pub(crate) fn run(shared: Arc<Shared>) {
    let mut scratch = Scratch::default();
    let mut next_second = shared.now() + 1_000_000_000;
    while !shared.stopping() {
        std::thread::sleep(TICK);
        let now = shared.now();
        let second = now >= next_second;
        if second {
            next_second += 1_000_000_000;
            if next_second <= now {
                next_second = now + 1_000_000_000;
            }
        }
        let table = shared.ports.load_full();
        tick(&table, now, second, &mut scratch);
        shared.qos.ticks.fetch_add(1, Ordering::Relaxed);
        if second {
            shared.qos.seconds.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Buffers the allocator reuses between ticks.
#[derive(Default)]
pub(crate) struct Scratch {
    claims: Vec<Claim>,
    members: Vec<usize>,
    out: Vec<f64>,
    bps: Vec<(f64, bool)>,
    breakpoints: Vec<(f64, f64)>,
}

/// One allocator round over `table` at time `now`; `second` closes a one-second sample.
pub(crate) fn tick(table: &PortTable, now: u64, second: bool, s: &mut Scratch) {
    let ports: Vec<&Arc<PortEntry>> = table.iter().flatten().collect();
    // Measure.
    s.bps.clear();
    for p in &ports {
        let mut st = p.qos.state.lock();
        let bytes = p.qos.wire_total();
        let thr: u64 = p.qos.throttled.iter().map(Counter::get).sum();
        let tick_ns = TICK.as_nanos() as f64;
        let rate = bytes.wrapping_sub(st.last_bytes) as f64 * 8.0 * 1e9 / tick_ns;
        let throttled = thr != st.last_throttled;
        st.last_bytes = bytes;
        st.last_throttled = thr;
        st.ewma_bps = 0.7 * st.ewma_bps + 0.3 * rate;
        if second {
            let dt = now.saturating_sub(st.second_at).max(1) as f64;
            let b = if p.qos.capacity.is_some() {
                p.counters.tx.iter().map(|t| t.tx_bytes.get()).sum()
            } else {
                bytes
            };
            st.rate_bps = b.wrapping_sub(st.second_bytes) as f64 * 8.0 * 1e9 / dt;
            st.second_bytes = b;
            st.second_at = now;
            st.alloc_last_second = p.qos.rate();
            let r = st.rate_bps;
            if st.history.len() == HISTORY {
                st.history.pop_front();
            }
            st.history.push_back(r);
        }
        s.bps.push((st.ewma_bps, throttled));
    }
    // Allocate, per uplink.
    for p in &ports {
        if p.qos.capacity.is_some() {
            p.qos.rate.store(UNLIMITED, Ordering::Relaxed);
            continue;
        }
        if uplink_of(table, p.vlan).is_none() {
            // No uplink: only the limit applies.
            let r = p.qos.settings().max.unwrap_or(UNLIMITED);
            p.qos.rate.store(r, Ordering::Relaxed);
            p.qos.state.lock().alloc = Some(r).filter(|&r| r != UNLIMITED);
        }
    }
    for up in ports.iter().filter(|p| p.qos.capacity.is_some()) {
        let cap = up.qos.capacity.unwrap_or(0) as f64;
        s.claims.clear();
        s.members.clear();
        for (i, p) in ports.iter().enumerate() {
            if p.vlan != up.vlan || p.qos.capacity.is_some() {
                continue;
            }
            let set = p.qos.settings();
            let mut st = p.qos.state.lock();
            let (ewma, throttled) = s.bps[i];
            let demand = match st.alloc {
                Some(a) if throttled || ewma >= 0.9 * a as f64 => {
                    (a as f64 * 1.25).max(a as f64 + cap / 50.0)
                }
                _ => (ewma * 1.25).max(cap / 100.0),
            };
            st.demand = demand;
            s.claims.push(Claim {
                demand,
                min: set.min.unwrap_or(0) as f64,
                max: set.max.map_or(f64::INFINITY, |m| m as f64),
                weight: f64::from(set.weight),
            });
            s.members.push(i);
        }
        s.out.clear();
        s.out.resize(s.claims.len(), 0.0);
        allocate(cap, &s.claims, &mut s.out, &mut s.breakpoints);
        for (k, &i) in s.members.iter().enumerate() {
            let r = (s.out[k] as u64).max(MIN_RATE);
            ports[i].qos.rate.store(r, Ordering::Relaxed);
            ports[i].qos.state.lock().alloc = Some(r);
        }
    }
}

/// `qos show`.
pub(crate) fn report(shared: &Shared) -> QosReport {
    let table = shared.ports.load_full();
    let ports = table
        .iter()
        .flatten()
        .map(|p| {
            let set = p.qos.settings();
            let st = p.qos.state.lock();
            let uplink = if p.qos.capacity.is_some() {
                None
            } else {
                uplink_of(&table, p.vlan).map(|(u, _)| u.config.name.clone())
            };
            QosPort {
                name: p.config.name.clone(),
                uplink,
                capacity: p.qos.capacity,
                min: set.min,
                max: set.max,
                weight: set.weight,
                alloc_bps: p.qos.rate(),
                demand_bps: st.demand as u64,
                rate_bps: st.rate_bps,
                alloc_last_second: st.alloc_last_second,
                throttled: p.qos.throttled.iter().map(Counter::get).sum(),
                history: st.history.iter().copied().collect(),
            }
        })
        .collect();
    QosReport {
        ticks: shared.qos.ticks.load(Ordering::Relaxed),
        seconds: shared.qos.seconds.load(Ordering::Relaxed),
        reservable: shared.qos.reservable,
        ports,
    }
}
