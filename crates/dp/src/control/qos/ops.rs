//! Switch-wide QoS operations over the port table: admission control, settings changes,
//! the allocator thread and `qos show`.
//!
//! The per-port state these work on ([`crate::qos::PortQos`]) is the hot path's, which
//! imports nothing of the port table, so the table can hold it without an import circle.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use qswitch_api::config::{format_rate, uplink_violation, QosMember, UplinkViolation};
use qswitch_api::request::{QosPort, QosReport};
use qswitch_api::QosSettings;

use super::alloc::{allocate, Claim};
use crate::policy::Policy;
use crate::qos::{QosUpdate, MIN_RATE, TICK, UNLIMITED};
use crate::stats::Counter;
use crate::table::{PortEntry, PortTable, Shared};

/// Checks `table` (with `name`'s QoS settings replaced by `changed`, and a port's policy by
/// `policy`) by the configuration's rule ([`qswitch_api::config::uplink_violation`]), so
/// that a live change the switch takes is one the configuration file could hold. The
/// message says what would be exceeded.
pub(crate) fn admit(
    table: &PortTable,
    reservable: f64,
    changed: Option<(&str, QosSettings)>,
    policy: Option<(&str, &Arc<Policy>)>,
) -> Result<(), String> {
    let ports: Vec<(&PortEntry, Arc<Policy>)> = table
        .iter()
        .flatten()
        .map(|p| {
            let pol = match policy {
                Some((n, pol)) if n == p.config.name => Arc::clone(pol),
                _ => p.policy.load_full(),
            };
            (&**p, pol)
        })
        .collect();
    let members: Vec<QosMember<'_>> = ports
        .iter()
        .map(|(p, pol)| QosMember {
            name: &p.config.name,
            carried: pol.carried(),
            capacity: p.qos.capacity,
            min: match changed {
                Some((n, s)) if n == p.config.name => s,
                _ => p.qos.settings(),
            }
            .min
            .unwrap_or(0),
        })
        .collect();
    match uplink_violation(&members, reservable) {
        None => Ok(()),
        Some(UplinkViolation::SharedVlan { first, second, vlan }) => Err(format!(
            "refused: ports '{first}' and '{second}' would both be uplinks (capacity) of VLAN {vlan}; at most one per VLAN; nothing changed"
        )),
        Some(UplinkViolation::Overbooked {
            uplink,
            sum,
            capacity,
            limit,
        }) => Err(format!(
            "refused: the guarantees toward uplink '{uplink}' would add up to {}, above reservable {reservable} x capacity {} = {}; nothing changed",
            format_rate(sum),
            format_rate(capacity),
            format_rate(limit)
        )),
    }
}

/// Whether port `p` is toward uplink `up`: they carry a VLAN in common (the uplink's native
/// VLAN or one it carries tagged, as `p`'s access VLAN or one of its own trunk's), so
/// `p`'s traffic to and from the outside can cross that uplink and shares its capacity.
fn toward(up: &PortEntry, p: &PortEntry) -> bool {
    up.policy
        .load()
        .carried()
        .common(&p.policy.load().carried())
        .is_some()
}

/// Why [`set`] changed nothing (the switch turns it into its own error).
#[derive(Debug)]
pub(crate) enum SetError {
    /// No port of that name.
    NoSuchPort(String),
    /// Bad settings, an uplink, or more than admission control allows: the message says.
    Refused(String),
}

/// Applies `update` to port `name` if admission control allows it and `record` (given the
/// new settings) succeeds. The caller holds the switch's control lock, which every change
/// that admission depends on takes (port add and remove too), so the sum admitted here
/// cannot move under it.
pub(crate) fn set<E: From<SetError>>(
    shared: &Shared,
    name: &str,
    update: &QosUpdate,
    record: impl FnOnce(QosSettings) -> Result<(), E>,
) -> Result<QosSettings, E> {
    let table = shared.ports.load_full();
    let entry = table
        .iter()
        .flatten()
        .find(|p| p.config.name == name)
        .ok_or_else(|| SetError::NoSuchPort(name.to_string()))?;
    if entry.qos.capacity.is_some() {
        return Err(SetError::Refused(format!(
            "port '{name}' is an uplink (capacity {}); its ports share it, it takes no qos settings",
            format_rate(entry.qos.capacity.unwrap_or(0))
        ))
        .into());
    }
    let new = update.apply(entry.qos.settings());
    new.check()
        .map_err(|m| SetError::Refused(format!("port '{name}': {m}")))?;
    admit(&table, shared.qos.reservable, Some((name, new)), None).map_err(SetError::Refused)?;
    record(new)?;
    *entry.qos.settings.lock() = new;
    shared.qos.settings_gen.fetch_add(1, Ordering::Release);
    shared.qos.notify();
    tracing::info!(port = %name, ?new, "qos settings changed");
    Ok(new)
}

/// The allocator thread: runs [`Allocator::step`] every [`TICK`] while some port is toward
/// an uplink (its rate is measured and allocated), else once a second (the per-second
/// sample) and at once after a settings or port table change, until the switch stops. So
/// a switch without uplinks wakes this thread once a second, however many ports it has,
/// and while no worker moves a frame (`activity`: the switch's [`crate::Switch::activity`])
/// that second costs nothing per port.
pub(crate) fn run(shared: &Shared, activity: impl Fn() -> u64) {
    let mut allocator = Allocator::new(shared.now());
    while !shared.stopping() {
        if allocator.groups.measured.is_empty() {
            let next = allocator.next_second.saturating_sub(shared.now());
            shared
                .qos
                .wait(std::time::Duration::from_nanos(next.max(1)));
        } else {
            std::thread::sleep(TICK);
        }
        if shared.stopping() {
            break;
        }
        allocator.step(shared, shared.now(), activity());
    }
}

/// The allocator's state between ticks: its buffers, what it knows of the port table, and
/// when the next one-second sample closes. Driven by the allocator thread, or by hand under
/// a manual clock.
#[derive(Default)]
pub(crate) struct Allocator {
    scratch: Scratch,
    next_second: u64,
    /// Ticks run so far.
    tick: u64,
    /// The table the groups below were worked out for (a weak reference: it keeps no port
    /// open), and the settings generation the fixed rates were set for.
    seen_table: std::sync::Weak<PortTable>,
    seen_gen: u64,
    groups: Groups,
    /// The switch's activity ([`crate::Switch::activity`]) at the last one-second sample,
    /// when it found every port's rate zero with no settings changed since: while the
    /// activity stands still, no port's counters moved and the sample is skipped (each
    /// port's history then misses zeros, which [`crate::qos::AllocState`] adds back).
    quiet_at: Option<u64>,
}

/// The ports of a table by their part in the allocation (slot indices into the table).
#[derive(Default)]
struct Groups {
    /// Per uplink: its slot, capacity and the slots of the ports toward it ([`toward`]).
    uplinks: Vec<(usize, u64, Vec<usize>)>,
    /// Ports toward an uplink (each once, even when toward several): measured every tick.
    measured: Vec<usize>,
    /// Every other port (toward no uplink, or an uplink itself): its rate changes
    /// only with its settings or the table.
    fixed: Vec<usize>,
}

impl Groups {
    fn of(table: &PortTable) -> Groups {
        let mut g = Groups::default();
        for up in table.iter().flatten() {
            if let Some(cap) = up.qos.capacity {
                g.uplinks.push((usize::from(up.id.0), cap, Vec::new()));
            }
        }
        for (slot, p) in table.iter().enumerate() {
            let Some(p) = p else { continue };
            let mut member = false;
            if p.qos.capacity.is_none() {
                for (_, _, members) in g
                    .uplinks
                    .iter_mut()
                    .filter(|(u, _, _)| table[*u].as_ref().is_some_and(|u| toward(u, p)))
                {
                    members.push(slot);
                    member = true;
                }
            }
            if member {
                g.measured.push(slot);
            } else {
                g.fixed.push(slot);
            }
        }
        g
    }
}

impl Allocator {
    pub(crate) fn new(now: u64) -> Allocator {
        Allocator {
            next_second: now + 1_000_000_000,
            ..Allocator::default()
        }
    }

    /// One tick at `now` (one [`TICK`] after the previous one); `activity` is the switch's
    /// ([`crate::Switch::activity`]), read before the counters.
    pub(crate) fn step(&mut self, shared: &Shared, now: u64, activity: u64) {
        let second = now >= self.next_second;
        if second {
            self.next_second += 1_000_000_000;
            if self.next_second <= now {
                self.next_second = now + 1_000_000_000;
            }
        }
        self.tick += 1;
        let table = shared.ports.load_full();
        let gen = shared.qos.settings_gen.load(Ordering::Acquire);
        let fresh = !std::ptr::eq(self.seen_table.as_ptr(), Arc::as_ptr(&table));
        if fresh {
            self.groups = Groups::of(&table);
            self.seen_table = Arc::downgrade(&table);
        }
        let fixed = fresh || gen != self.seen_gen || self.tick == 1;
        self.seen_gen = gen;
        if fixed {
            self.quiet_at = None;
        }
        // This second's number, as `seconds` counts it once the sample is taken.
        let seconds = shared.qos.seconds.load(Ordering::Relaxed) + 1;
        let sample = (second && self.quiet_at != Some(activity)).then_some(seconds);
        let quiet = tick(
            &table,
            &self.groups,
            now,
            self.tick,
            sample,
            fixed,
            &mut self.scratch,
        );
        if sample.is_some() {
            self.quiet_at = quiet.then_some(activity);
        }
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
    /// Per slot: (measured rate EWMA, throttled this tick).
    bps: Vec<(f64, bool)>,
    breakpoints: Vec<(f64, f64)>,
    /// Per slot: the smallest allocation of this tick over the uplinks it is toward.
    rates: Vec<u64>,
}

/// One allocator round over `table` (grouped as `g`) at time `now`, tick number `tick`;
/// `second` (its number) closes a one-second sample; `fixed` redoes the rates that depend
/// only on the settings. A tick costs O(ports under an uplink), plus O(all ports) on a
/// one-second sample and on a change. Returns whether the sample (if any) found every
/// port's rate zero.
fn tick(
    table: &PortTable,
    g: &Groups,
    now: u64,
    tick: u64,
    second: Option<u64>,
    fixed: bool,
    s: &mut Scratch,
) -> bool {
    let port = |slot: usize| table.get(slot).and_then(Option::as_ref);
    // Measure the ports that compete for an uplink.
    s.bps.resize(table.len(), (0.0, false));
    for &slot in &g.measured {
        let Some(p) = port(slot) else { continue };
        let mut st = p.qos.state.lock();
        let bytes = p.qos.wire_total();
        let thr: u64 = p.qos.throttled.iter().map(Counter::get).sum();
        // A port not measured last tick (it just joined an uplink's VLAN) starts afresh.
        let afresh = st.measured_tick != 0 && st.measured_tick + 1 != tick;
        st.measured_tick = tick;
        if afresh {
            st.last_bytes = bytes;
            st.last_throttled = thr;
        }
        let tick_ns = TICK.as_nanos() as f64;
        let rate = bytes.wrapping_sub(st.last_bytes) as f64 * 8.0 * 1e9 / tick_ns;
        let throttled = thr != st.last_throttled;
        st.last_bytes = bytes;
        st.last_throttled = thr;
        st.ewma_bps = 0.7 * st.ewma_bps + 0.3 * rate;
        s.bps[slot] = (st.ewma_bps, throttled);
    }
    // Once a second, every port's sample (unless skipped as idle: see `Allocator`).
    let mut quiet = true;
    if let Some(second) = second {
        for p in table.iter().flatten() {
            let mut st = p.qos.state.lock();
            // Seconds skipped since its last sample moved nothing: what moved did in the
            // last second.
            let since = st
                .second_at
                .max(now.saturating_sub(1_000_000_000 + TICK.as_nanos() as u64));
            let dt = now.saturating_sub(since).max(1) as f64;
            let b = if p.qos.capacity.is_some() {
                p.counters.tx.iter().map(|t| t.tx_bytes.get()).sum()
            } else {
                p.qos.wire_total()
            };
            st.rate_bps = b.wrapping_sub(st.second_bytes) as f64 * 8.0 * 1e9 / dt;
            st.second_bytes = b;
            st.second_at = now;
            st.alloc_last_second = p.qos.rate();
            let r = st.rate_bps;
            quiet &= r == 0.0;
            st.push_history(second, r);
        }
    }
    // Uplinks are not shaped; a port with no uplink has only its limit.
    if fixed {
        for p in g.fixed.iter().filter_map(|&slot| port(slot)) {
            if p.qos.capacity.is_some() {
                p.qos.rate.store(UNLIMITED, Ordering::Relaxed);
                continue;
            }
            let r = p.qos.settings().max.unwrap_or(UNLIMITED);
            p.qos.rate.store(r, Ordering::Relaxed);
            p.qos.state.lock().alloc = Some(r).filter(|&r| r != UNLIMITED);
        }
    }
    // Allocate, per uplink; a port toward several (a trunk) gets the smallest of its shares.
    s.rates.clear();
    s.rates.resize(table.len(), u64::MAX);
    for (up_slot, cap, members) in &g.uplinks {
        // A bond shares the capacity of its members still up.
        let cap = match port(*up_slot).map(|u| &u.dev) {
            Some(crate::port::Device::Bond(b)) => {
                let (up, n) = b.members_up();
                bond_capacity(*cap, up, n)
            }
            _ => *cap,
        } as f64;
        s.claims.clear();
        s.members.clear();
        for &slot in members {
            let Some(p) = port(slot) else { continue };
            let set = p.qos.settings();
            let mut st = p.qos.state.lock();
            let (ewma, throttled) = s.bps[slot];
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
            s.members.push(slot);
        }
        s.out.clear();
        s.out.resize(s.claims.len(), 0.0);
        allocate(cap, &s.claims, &mut s.out, &mut s.breakpoints);
        for (k, &slot) in s.members.iter().enumerate() {
            let r = (s.out[k] as u64).max(MIN_RATE);
            s.rates[slot] = s.rates[slot].min(r);
        }
    }
    for &slot in &g.measured {
        let Some(p) = port(slot) else { continue };
        let r = s.rates[slot];
        if r != u64::MAX {
            p.qos.rate.store(r, Ordering::Relaxed);
            p.qos.state.lock().alloc = Some(r);
        }
    }
    quiet
}

/// The capacity a bond uplink with `capacity` configured shares while `up` of its `members`
/// carry traffic: `capacity` × `up` / `members` (the members are taken as equal links; 0
/// when none is up).
pub fn bond_capacity(capacity: u64, up: u32, members: u32) -> u64 {
    if members == 0 {
        return 0;
    }
    (u128::from(capacity) * u128::from(up.min(members)) / u128::from(members)) as u64
}

/// `qos show`.
pub(crate) fn report(shared: &Shared) -> QosReport {
    report_of(shared, false)
}

/// `qos show` of the ports with QoS settings, an uplink or a capacity only, without the
/// per-second histories: what the daemon's 1-s sampler needs, at no cost per port left
/// alone (no name copied, no history cloned).
pub(crate) fn report_configured(shared: &Shared) -> QosReport {
    report_of(shared, true)
}

fn report_of(shared: &Shared, configured_only: bool) -> QosReport {
    let seconds = shared.qos.seconds.load(Ordering::Relaxed);
    let table = shared.ports.load_full();
    let uplinks: Vec<&Arc<PortEntry>> = table
        .iter()
        .flatten()
        .filter(|p| p.qos.capacity.is_some())
        .collect();
    let ports = table
        .iter()
        .flatten()
        .filter_map(|p| {
            let set = p.qos.settings();
            // The first uplink it is toward (a port may be toward several: a trunk).
            let uplink = if p.qos.capacity.is_some() {
                None
            } else {
                uplinks.iter().find(|u| toward(u, p))
            };
            let configured = set.min.is_some()
                || set.max.is_some()
                || set.weight != 1
                || p.qos.capacity.is_some()
                || uplink.is_some();
            if configured_only && !configured {
                return None;
            }
            let uplink = uplink.map(|u| u.config.name.clone());
            let st = p.qos.state.lock();
            Some(QosPort {
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
                history: if configured_only {
                    Vec::new()
                } else {
                    st.history_at(seconds)
                },
                bond_members_up: match (&p.dev, p.qos.capacity) {
                    (crate::port::Device::Bond(b), Some(_)) => {
                        let (up, n) = b.members_up();
                        Some([up, n])
                    }
                    _ => None,
                },
            })
        })
        .collect();
    QosReport {
        ticks: shared.qos.ticks.load(Ordering::Relaxed),
        seconds: shared.qos.seconds.load(Ordering::Relaxed),
        reservable: shared.qos.reservable,
        ports,
    }
}

#[cfg(test)]
mod tests {
    use super::bond_capacity;

    /// Issue 28: a bond uplink shares the capacity of its members still up.
    #[test]
    fn a_bond_shares_the_capacity_of_its_members_up() {
        let g = 1_000_000_000;
        assert_eq!(bond_capacity(2 * g, 2, 2), 2 * g);
        assert_eq!(bond_capacity(2 * g, 1, 2), g);
        assert_eq!(bond_capacity(3 * g, 2, 3), 2 * g);
        assert_eq!(bond_capacity(2 * g, 0, 2), 0);
        // Nothing odd from odd input: no members, more up than members, huge capacities.
        assert_eq!(bond_capacity(2 * g, 1, 0), 0);
        assert_eq!(bond_capacity(2 * g, 5, 2), 2 * g);
        assert_eq!(
            bond_capacity(u64::MAX, 7, 8),
            u64::MAX / 8 * 7 + 7 * (u64::MAX % 8) / 8
        );
    }
}
