//! Bond ports (`type = "bond"`, issue 28): a port made of member ports ([`Members`]), with
//! the protocol cores beside it: [`lacp`] (IEEE 802.1AX link aggregation, per member) and
//! [`lldp`] (IEEE 802.1AB neighbour table and transmitter). The cores are pure state machines
//! (time passed in, frames in and out as values), tested on their own and against real
//! partners: Open vSwitch in crates/dp/tests/bond_lacp.rs, lldpd in
//! crates/dp/tests/bond_lldp.rs.
//!
//! ```text
//!   workers ── rx_burst(queue) ── member's queue ── LACPDU? ──> bond thread (LACP machine)
//!                                      │ does this member take it? (mode, active member)
//!           ── tx_burst ── active member (active-backup) / hash bucket → member (balance)
//!   netlink link events ──> carrier thread ──> bond thread: carrier, up/down delays, LACP,
//!                                             which members carry traffic, gratuitous RARPs
//! ```
//!
//! - **Which member carries what**: a member is *enabled* while its carrier is up (after
//!   `updelay`, until `downdelay` after it drops) and, with LACP on, while the LACP mux says
//!   distributing (with `lacp_fallback`, while no member has a partner, every member with
//!   carrier counts as distributing, the bond then acting active-backup). Active-backup sends
//!   by the active member and takes frames from it only; the active member stays while it is
//!   enabled (no fail-back), `qswitch bond set NAME --active MEMBER` moves it. balance-slb and
//!   balance-tcp hash each frame to one of 256 buckets (balance-slb: source MAC and VLAN;
//!   balance-tcp: the L3/L4 5-tuple, source MAC for non-IP frames), spread evenly over the
//!   enabled members whenever that set changes; every 10 s buckets move from the most to the least loaded member
//!   when that evens the load out.
//! - **No loops, no duplicates** (balance-slb, switch-independent): broadcast and multicast
//!   are taken from the active member only, and a frame whose source MAC the bond itself sent
//!   in the last 5 minutes (a frame of one of our local MACs, reflected by the physical
//!   switch) is dropped. Those MACs sit in a 4096-slot direct-mapped table written on
//!   transmit: a collision forgets a MAC early (a reflected frame may then pass once).
//! - **LACPDUs** are consumed by the bond (handed to its thread, never forwarded). With
//!   `lldp` on the bond, each member has its own LLDP agent: an LLDPDU a member receives is
//!   consumed by that member's agent (before the active-backup and balance-slb rules);
//!   without, LLDPDUs and other link-local frames go on to the pipeline's link-local stage
//!   as every port's do.
//! - **Gratuitous RARP**: when the active member changes (active-backup) or buckets move to
//!   another member (balance-slb), one RARP per MAC learned on the switch's other ports, in
//!   each VLAN the bond carries (tagged as the bond carries it), goes out by the member now
//!   carrying that MAC, so the physical switches relearn at once. balance-tcp sends none: its
//!   partner sees one LAG.
//! - Control frames (LACPDUs, RARPs) are sent from the bond's thread through the member's
//!   own transmit (every member kind locks its transmit queue, so this is safe beside the
//!   workers).

pub mod lacp;
/// The LLDP machine lives with the agent ([`crate::lldp`]); named here too, beside LACP.
pub use crate::lldp::machine as lldp;

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use qswitch_api::bond::{BondInfo, BondMemberInfo, LacpMemberInfo};
use qswitch_api::{BondConfig, BondMode, LacpMode, LacpRate};
use qswitch_wire::lacp::Lacpdu;
use qswitch_wire::MacAddr;

use super::members::{Member, Members, TxPolicy};
use super::{Device, Port, TxDone};
use crate::packet::Pkt;
use crate::stats::{DropReason, DropTally};

/// Most members of a bond.
pub const MAX_MEMBERS: usize = 8;
/// Hash buckets of balance-slb and balance-tcp.
pub const BUCKETS: usize = 256;
/// How often buckets are rebalanced by load.
pub const REBALANCE: Duration = Duration::from_secs(10);
/// How long a MAC the bond sent counts as local (balance-slb's reflection check).
const LOCAL_MAC_NS: u64 = 300_000_000_000;
const LOCAL_SLOTS: usize = 4096;
const NONE: usize = usize::MAX;

/// The MACs to announce after a failover: (MAC, 802.1Q tag or `None` for untagged), given by
/// the switch (what it learned on its other ports, in the VLANs the bond carries).
pub type Announce = Box<dyn Fn() -> Vec<(MacAddr, Option<u16>)> + Send + Sync>;

/// Per-member counters.
#[derive(Debug, Default)]
struct MemberCounters {
    rx: AtomicU64,
    tx: AtomicU64,
    rx_dropped: AtomicU64,
    lacp_rx: AtomicU64,
    lacp_tx: AtomicU64,
    rarp_tx: AtomicU64,
}

/// What the data path and the bond's threads share.
struct Shared {
    mode: BondMode,
    lacp: bool,
    members: Members,
    names: Vec<String>,
    carrier: Vec<AtomicBool>,
    counters: Vec<MemberCounters>,
    /// The active member (active-backup's sender, balance-slb's flood receiver), [`NONE`]
    /// when no member is enabled.
    active: AtomicUsize,
    buckets: [AtomicU8; BUCKETS],
    bucket_bytes: [AtomicU64; BUCKETS],
    /// balance-slb: MACs the bond sent (MAC in the low 48 bits, seconds in the high 16).
    local: Box<[AtomicU64]>,
    lacp_status: parking_lot::Mutex<Vec<Option<LacpMemberInfo>>>,
    stop: AtomicBool,
    /// The clock of the local MAC table.
    started: Instant,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("mode", &self.mode)
            .field("members", &self.names)
            .finish_non_exhaustive()
    }
}

enum Event {
    Lacpdu(usize, Lacpdu),
    Carrier(usize, bool),
    SetActive(usize),
    Stop,
}

/// A bond port (see the module docs).
pub struct BondPort {
    name: String,
    cfg: BondConfig,
    shared: Arc<Shared>,
    events: SyncSender<Event>,
    threads: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    /// LLDP on the members (`lldp` of the bond): one agent per member, in member order;
    /// empty when off.
    lldp: Box<[Option<crate::lldp::LldpAgent>]>,
}

impl std::fmt::Debug for BondPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BondPort")
            .field("name", &self.name)
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

/// Why a bond did not open.
#[derive(Debug, thiserror::Error)]
pub enum BondError {
    #[error("a bond has at most {MAX_MEMBERS} members")]
    TooMany,
    #[error("cannot start the bond's thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot watch link notifications: {0}")]
    LinkWatch(std::io::Error),
}

/// A small fast hash for bucket choice (FNV-1a).
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

fn is_lacpdu(f: &[u8]) -> bool {
    f.len() >= 14
        && f[..6] == qswitch_wire::lacp::SLOW_PROTOCOLS_MAC.0
        && f[12..14] == qswitch_wire::lacp::ETHERTYPE.to_be_bytes()
}

fn mac48(b: &[u8]) -> u64 {
    b.iter().take(6).fold(0, |a, &x| (a << 8) | u64::from(x))
}

/// The bucket of a frame: balance-slb by source MAC and VLAN tag, balance-tcp by flow.
#[inline]
fn bucket(mode: BondMode, f: &[u8]) -> usize {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    match mode {
        BondMode::BalanceTcp => match qswitch_wire::flow::extract(f) {
            Some(k) => k.hash(&mut h),
            None => h.write(f.get(6..12).unwrap_or_default()),
        },
        _ => {
            h.write(f.get(6..12).unwrap_or_default());
            if f.get(12..14) == Some(&[0x81, 0x00]) {
                h.write(f.get(14..16).unwrap_or_default());
            }
        }
    }
    (h.finish() as usize) % BUCKETS
}

/// A gratuitous RARP for `mac` (as Open vSwitch sends): broadcast, reverse request, sender
/// and target hardware address `mac`, protocol addresses zero.
pub fn rarp(mac: MacAddr, tag: Option<u16>) -> Vec<u8> {
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&mac.0);
    if let Some(vid) = tag {
        f.extend_from_slice(&[0x81, 0x00]);
        f.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    }
    f.extend_from_slice(&[0x80, 0x35, 0, 1, 0x08, 0, 6, 4, 0, 3]);
    f.extend_from_slice(&mac.0);
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(&mac.0);
    f.extend_from_slice(&[0; 4]);
    f.resize(f.len().max(60), 0);
    f
}

fn read_sys(ifname: &str, what: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/{what}"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// A member's carrier (`/sys/class/net/IF/carrier`: unreadable while the link is down).
fn carrier(ifname: &str) -> bool {
    read_sys(ifname, "carrier").as_deref() == Some("1")
}

impl Shared {
    fn enabled(&self, m: usize) -> bool {
        self.members.members().get(m).is_some_and(Member::up)
    }

    fn send(&self, m: usize, frame: &[u8]) -> bool {
        let Some(member) = self.members.members().get(m) else {
            return false;
        };
        let mut pkts = [Pkt::new()];
        pkts[0].fill(frame);
        let mut drops = DropTally::default();
        member.dev.tx_burst(0, &mut pkts, &[0], &mut drops).packets == 1
    }

    fn secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    fn remember_local(&self, src: &[u8], now_s: u64) {
        let mac = mac48(src);
        let slot = (mac.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % LOCAL_SLOTS;
        let v = mac | ((now_s & 0xffff) << 48);
        if self.local[slot].load(Ordering::Relaxed) != v {
            self.local[slot].store(v, Ordering::Relaxed);
        }
    }

    fn is_local(&self, src: &[u8], now_s: u64) -> bool {
        let mac = mac48(src);
        let slot = (mac.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize % LOCAL_SLOTS;
        let v = self.local[slot].load(Ordering::Relaxed);
        v != 0
            && v & 0xffff_ffff_ffff == mac
            && (now_s.wrapping_sub(v >> 48) & 0xffff) <= LOCAL_MAC_NS / 1_000_000_000
    }
}

impl BondPort {
    /// A bond of `devices` (one per member of `cfg`, in order, with their rx queue counts);
    /// starts its threads. `announce` lists the MACs to announce after a failover.
    pub fn open(
        name: &str,
        cfg: &BondConfig,
        devices: Vec<(Device, u16)>,
        announce: Announce,
    ) -> Result<BondPort, BondError> {
        if devices.len() > MAX_MEMBERS {
            return Err(BondError::TooMany);
        }
        let names: Vec<String> = cfg.members.iter().map(|m| m.ifname.to_string()).collect();
        let members = devices
            .into_iter()
            .zip(&names)
            .map(|((dev, queues), n)| {
                let m = Member::new(n, dev, queues);
                m.set_up(false);
                m
            })
            .collect();
        let n = names.len();
        let shared = Arc::new(Shared {
            mode: cfg.mode,
            lacp: cfg.lacp != LacpMode::Off,
            members: Members::new(members, TxPolicy::ActiveBackup),
            carrier: (0..n).map(|_| AtomicBool::new(false)).collect(),
            counters: (0..n).map(|_| MemberCounters::default()).collect(),
            names,
            active: AtomicUsize::new(NONE),
            buckets: std::array::from_fn(|_| AtomicU8::new(0)),
            bucket_bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            local: (0..LOCAL_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            lacp_status: parking_lot::Mutex::new(vec![None; n]),
            stop: AtomicBool::new(false),
            started: Instant::now(),
        });
        let watch = qswitch_sys::rtnl::LinkWatch::open().map_err(BondError::LinkWatch)?;
        let (events, rx) = mpsc::sync_channel(256);
        let port = BondPort {
            name: name.to_string(),
            cfg: cfg.clone(),
            shared: shared.clone(),
            events: events.clone(),
            threads: parking_lot::Mutex::new(Vec::new()),
            lldp: Box::new([]),
        };
        let carrier_thread = {
            let shared = shared.clone();
            qswitch_sys::thread::spawn(
                format!("bond-link-{name}"),
                &[],
                |why| tracing::error!("{why}; the bond no longer follows its members' carrier"),
                move |_| watch_carrier(&shared, &watch, &events),
            )
            .map_err(BondError::Thread)?
        };
        port.threads.lock().push(carrier_thread);
        let control = {
            let cfg = cfg.clone();
            let name = name.to_string();
            qswitch_sys::thread::spawn(
                format!("bond-{name}"),
                &[],
                |why| tracing::error!("{why}; the bond's LACP and failover stop"),
                move |_| Control::new(cfg, shared, announce).run(&rx),
            )
            .map_err(BondError::Thread)?
        };
        port.threads.lock().push(control);
        Ok(port)
    }

    /// Runs LLDP on the members: `agents[m]` is member `m`'s (`None`: no LLDP on it).
    pub fn set_lldp(&mut self, agents: Vec<Option<crate::lldp::LldpAgent>>) {
        self.lldp = if agents.iter().any(Option::is_some) {
            agents.into_boxed_slice()
        } else {
            Box::new([])
        };
    }

    /// The members' LLDP agents: (member interface, agent), in member order.
    pub fn lldp_agents(&self) -> impl Iterator<Item = (&str, &crate::lldp::LldpAgent)> {
        self.shared
            .names
            .iter()
            .zip(self.lldp.iter())
            .filter_map(|(n, a)| Some((n.as_str(), a.as_ref()?)))
    }

    /// Sends `frame` by member `ifname`'s own device (an LLDPDU: not by the bond's transmit
    /// policy, whatever member carries traffic); whether it went.
    pub fn send_by_member(&self, ifname: &str, frame: &[u8]) -> bool {
        self.shared
            .names
            .iter()
            .position(|n| n == ifname)
            .is_some_and(|m| self.shared.send(m, frame))
    }

    /// (members carrying traffic now, members): what the QoS allocator shares
    /// ([`crate::control::qos::bond_capacity`]).
    pub fn members_up(&self) -> (u32, u32) {
        let members = self.shared.members.members();
        let up = members.iter().filter(|m| m.up()).count();
        (up as u32, members.len() as u32)
    }

    /// The port's rx queues: its members', member by member.
    pub fn queues(&self) -> u16 {
        self.shared.members.queues()
    }

    /// The member a frame leaves by now (for trace): the active member, or the frame's
    /// bucket's.
    pub fn tx_member(&self, frame: &[u8]) -> Option<&str> {
        let s = &self.shared;
        let m = match s.mode {
            BondMode::ActiveBackup => s.active.load(Ordering::Relaxed),
            mode => usize::from(s.buckets[bucket(mode, frame)].load(Ordering::Relaxed)),
        };
        s.enabled(m).then(|| s.names[m].as_str())
    }

    /// Makes `member` the active member (active-backup; balance-slb's flood receiver).
    pub fn set_active(&self, member: &str) -> Result<(), String> {
        let m = self
            .shared
            .names
            .iter()
            .position(|n| n == member)
            .ok_or_else(|| format!("bond {} has no member '{member}'", self.name))?;
        if !self.shared.enabled(m) {
            return Err(format!(
                "member '{member}' of bond {} does not carry traffic now (link down or LACP \
                 not distributing)",
                self.name
            ));
        }
        self.events
            .send(Event::SetActive(m))
            .map_err(|_| format!("bond {} is stopping", self.name))?;
        // The bond's thread applies it at once; wait so `bond show` after the call says so.
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.shared.active.load(Ordering::Relaxed) != m && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// What `qswitch bond show` prints.
    pub fn info(&self) -> BondInfo {
        let s = &self.shared;
        let lacp = s.lacp_status.lock().clone();
        let active = s.active.load(Ordering::Relaxed);
        let mut buckets = vec![0u32; s.names.len()];
        if s.mode != BondMode::ActiveBackup {
            for b in &s.buckets {
                let m = usize::from(b.load(Ordering::Relaxed));
                if s.enabled(m) {
                    buckets[m] += 1;
                }
            }
        }
        BondInfo {
            name: self.name.clone(),
            mode: self.cfg.mode,
            lacp: self.cfg.lacp,
            lacp_rate: self.cfg.lacp_rate,
            active: s.names.get(active).cloned(),
            members: s
                .names
                .iter()
                .enumerate()
                .map(|(m, name)| {
                    let c = &s.counters[m];
                    BondMemberInfo {
                        name: name.clone(),
                        carrier: s.carrier[m].load(Ordering::Relaxed),
                        enabled: s.enabled(m),
                        buckets: buckets[m],
                        rx_packets: c.rx.load(Ordering::Relaxed),
                        tx_packets: c.tx.load(Ordering::Relaxed),
                        rx_dropped: c.rx_dropped.load(Ordering::Relaxed),
                        lacp_rx: c.lacp_rx.load(Ordering::Relaxed),
                        lacp_tx: c.lacp_tx.load(Ordering::Relaxed),
                        rarp_tx: c.rarp_tx.load(Ordering::Relaxed),
                        lacp_state: lacp.get(m).cloned().flatten(),
                    }
                })
                .collect(),
        }
    }
}

impl Drop for BondPort {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = self.events.try_send(Event::Stop);
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

/// Reads the members' carriers at start and at each netlink link notification (no polling:
/// the wait returns early on a notification; its timeout only checks for stop).
fn watch_carrier(
    shared: &Shared,
    watch: &qswitch_sys::rtnl::LinkWatch,
    events: &SyncSender<Event>,
) {
    let mut known: Vec<Option<bool>> = vec![None; shared.names.len()];
    let mut changed = true;
    while !shared.stop.load(Ordering::Relaxed) {
        if changed {
            for (m, name) in shared.names.iter().enumerate() {
                let up = carrier(name);
                if known[m] != Some(up) {
                    known[m] = Some(up);
                    if events.send(Event::Carrier(m, up)).is_err() {
                        return;
                    }
                }
            }
        }
        changed = match watch.wait(Duration::from_millis(200)) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "bond: link notifications failed");
                return;
            }
        };
    }
}

/// The bond's control thread: LACP, carrier with delays, which members are enabled, the
/// active member, buckets and gratuitous RARPs.
struct Control {
    cfg: BondConfig,
    shared: Arc<Shared>,
    announce: Announce,
    lacp: Option<lacp::Lacp>,
    macs: Vec<MacAddr>,
    /// Carrier as last reported, and since when.
    carrier: Vec<(bool, Instant)>,
    preferred: Option<usize>,
    next_rebalance: Instant,
}

impl Control {
    fn new(cfg: BondConfig, shared: Arc<Shared>, announce: Announce) -> Control {
        let now = Instant::now();
        let macs: Vec<MacAddr> = shared
            .names
            .iter()
            .map(|n| {
                read_sys(n, "address")
                    .and_then(|a| a.parse().ok())
                    .unwrap_or(MacAddr([0x02, 0, 0, 0, 0, 1]))
            })
            .collect();
        let lacp = (cfg.lacp != LacpMode::Off).then(|| {
            let mut l = lacp::Lacp::new(lacp::Config {
                mode: if cfg.lacp == LacpMode::Active {
                    lacp::Mode::Active
                } else {
                    lacp::Mode::Passive
                },
                rate: match cfg.lacp_rate {
                    LacpRate::Fast => lacp::Rate::Fast,
                    LacpRate::Slow => lacp::Rate::Slow,
                },
                system_priority: 65534,
                system: macs.first().copied().unwrap_or(MacAddr([2, 0, 0, 0, 0, 1])),
                key: 1,
            });
            for m in 0..macs.len() {
                l.add_member(m as u16 + 1, 255);
            }
            l
        });
        Control {
            carrier: vec![(false, now); shared.names.len()],
            cfg,
            shared,
            announce,
            lacp,
            macs,
            preferred: None,
            next_rebalance: now + REBALANCE,
        }
    }

    fn run(mut self, events: &Receiver<Event>) {
        loop {
            let now = Instant::now();
            let mut wake = self.next_rebalance;
            if let Some(t) = self.lacp.as_ref().and_then(lacp::Lacp::next_wakeup) {
                wake = wake.min(t);
            }
            if let Some(t) = self.next_delay(now) {
                wake = wake.min(t);
            }
            match events.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Ok(Event::Lacpdu(m, pdu)) => {
                    if let Some(l) = &mut self.lacp {
                        l.receive(m, &pdu, Instant::now());
                    }
                }
                Ok(Event::Carrier(m, up)) => {
                    let now = Instant::now();
                    self.carrier[m] = (up, now);
                    self.shared.carrier[m].store(up, Ordering::Relaxed);
                    if let Some(l) = &mut self.lacp {
                        l.set_link(m, up, now);
                    }
                    tracing::info!(member = %self.shared.names[m], up, "bond member carrier");
                }
                Ok(Event::SetActive(m)) => self.preferred = Some(m),
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self.shared.stop.load(Ordering::Relaxed) {
                return;
            }
            let now = Instant::now();
            if let Some(l) = &mut self.lacp {
                let (shared, macs) = (&self.shared, &self.macs);
                l.poll(now, |m, pdu| {
                    if shared.send(m, &pdu.frame(macs[m])) {
                        shared.counters[m].lacp_tx.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            self.update(now);
        }
    }

    /// The next time an up or down delay runs out.
    fn next_delay(&self, now: Instant) -> Option<Instant> {
        self.carrier
            .iter()
            .enumerate()
            .filter_map(|(m, &(up, since))| {
                let delay = if up {
                    self.cfg.updelay
                } else {
                    self.cfg.downdelay
                };
                let t = since + Duration::from_millis(u64::from(delay));
                (t > now && up != self.shared.enabled(m)).then_some(t)
            })
            .min()
    }

    /// Whether member `m`'s carrier counts as up, with the delays.
    fn link_ok(&self, m: usize, now: Instant) -> bool {
        let (up, since) = self.carrier[m];
        let held = now.duration_since(since);
        if up {
            held >= Duration::from_millis(u64::from(self.cfg.updelay)) || self.shared.enabled(m)
        } else {
            self.shared.enabled(m) && held < Duration::from_millis(u64::from(self.cfg.downdelay))
        }
    }

    fn update(&mut self, now: Instant) {
        let n = self.shared.names.len();
        let fallback = self.cfg.lacp_fallback
            && self.lacp.as_ref().is_some_and(|l| {
                (0..n).all(|m| l.status(m).is_none_or(|s| s.rx != lacp::RxState::Current))
            });
        let mut enabled = vec![false; n];
        for (m, e) in enabled.iter_mut().enumerate() {
            let lacp_ok = match &self.lacp {
                None => true,
                Some(_) if fallback => true,
                Some(l) => l.distributing(m),
            };
            *e = self.link_ok(m, now) && lacp_ok;
        }
        if let Some(l) = &self.lacp {
            let mut st = self.shared.lacp_status.lock();
            for (m, slot) in st.iter_mut().enumerate() {
                *slot = l.status(m).map(|s| LacpMemberInfo {
                    rx: format!("{:?}", s.rx).to_lowercase(),
                    mux: format!("{:?}", s.mux).to_lowercase(),
                    selected: s.selected,
                    actor_state: s.actor.state.0,
                    partner_system: s.partner.system.to_string(),
                    partner_priority: s.partner.system_priority,
                    partner_key: s.partner.key,
                    partner_port: s.partner.port,
                    partner_state: s.partner.state.0,
                    partner_in_sync: s.partner_in_sync,
                });
            }
        }
        let mut changed = false;
        for (m, &e) in enabled.iter().enumerate() {
            let member = &self.shared.members.members()[m];
            if member.up() != e {
                member.set_up(e);
                changed = true;
                tracing::info!(member = %member.name, enabled = e, "bond member");
            }
        }
        // The active member: the one asked for, else the current one while enabled, else
        // the first enabled.
        let old = self.shared.active.load(Ordering::Relaxed);
        let keep = |m: usize| m < n && enabled[m];
        let active = match self.preferred {
            Some(p) if keep(p) => p,
            _ if keep(old) => old,
            _ => enabled.iter().position(|&e| e).unwrap_or(NONE),
        };
        self.preferred = None;
        let mut moved_buckets = Vec::new();
        if changed || old == NONE {
            moved_buckets = self.assign_buckets(&enabled);
        }
        if now >= self.next_rebalance {
            self.next_rebalance = now + REBALANCE;
            moved_buckets.extend(self.rebalance(&enabled));
        }
        if active != old {
            self.shared.active.store(active, Ordering::Relaxed);
            tracing::info!(
                active = self.shared.names.get(active).map_or("none", String::as_str),
                "bond active member"
            );
            if active != NONE && self.cfg.mode == BondMode::ActiveBackup {
                let macs = (self.announce)();
                self.rarps(active, &macs);
            }
        }
        if self.cfg.mode == BondMode::BalanceSlb && !moved_buckets.is_empty() {
            let macs = (self.announce)();
            for (mac, tag) in macs {
                let f = rarp(mac, tag);
                let b = bucket(BondMode::BalanceSlb, &f);
                if moved_buckets.contains(&b) {
                    let m = usize::from(self.shared.buckets[b].load(Ordering::Relaxed));
                    self.rarps(m, &[(mac, tag)]);
                }
            }
        }
    }

    fn rarps(&self, m: usize, macs: &[(MacAddr, Option<u16>)]) {
        for &(mac, tag) in macs {
            if self.shared.send(m, &rarp(mac, tag)) {
                self.shared.counters[m]
                    .rarp_tx
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Spreads the buckets over the enabled members again (bucket `b` to the `b % n`th), as
    /// the set of enabled members changed; returns the buckets that moved.
    fn assign_buckets(&self, enabled: &[bool]) -> Vec<usize> {
        let on: Vec<usize> = (0..enabled.len()).filter(|&m| enabled[m]).collect();
        if on.is_empty() {
            return Vec::new();
        }
        let mut moved = Vec::new();
        for (b, slot) in self.shared.buckets.iter().enumerate() {
            let to = on[b % on.len()];
            if usize::from(slot.load(Ordering::Relaxed)) != to {
                slot.store(to as u8, Ordering::Relaxed);
                moved.push(b);
            }
        }
        moved
    }

    /// Moves buckets from the most to the least loaded enabled member while that evens the
    /// load (bytes since the last rebalance); returns the buckets that moved.
    fn rebalance(&self, enabled: &[bool]) -> Vec<usize> {
        let s = &self.shared;
        let bytes: Vec<u64> = s
            .bucket_bytes
            .iter()
            .map(|b| b.swap(0, Ordering::Relaxed))
            .collect();
        if s.mode == BondMode::ActiveBackup || enabled.iter().filter(|&&e| e).count() < 2 {
            return Vec::new();
        }
        let mut load = vec![0u64; enabled.len()];
        for (b, &n) in bytes.iter().enumerate() {
            load[usize::from(s.buckets[b].load(Ordering::Relaxed))] += n;
        }
        let mut moved = Vec::new();
        for _ in 0..BUCKETS {
            let on = (0..enabled.len()).filter(|&m| enabled[m]);
            let (Some(hi), Some(lo)) = (
                on.clone().max_by_key(|&m| load[m]),
                on.min_by_key(|&m| load[m]),
            ) else {
                break;
            };
            let gap = load[hi] - load[lo];
            // The busiest bucket of `hi` that fits in the gap without reversing it.
            let best = (0..BUCKETS)
                .filter(|&b| usize::from(s.buckets[b].load(Ordering::Relaxed)) == hi)
                .filter(|&b| bytes[b] > 0 && bytes[b] * 2 < gap)
                .max_by_key(|&b| bytes[b]);
            let Some(b) = best else { break };
            s.buckets[b].store(lo as u8, Ordering::Relaxed);
            load[hi] -= bytes[b];
            load[lo] += bytes[b];
            moved.push(b);
        }
        moved
    }
}

impl Port for BondPort {
    fn rx_burst(&self, queue: u16, pkts: &mut [Pkt], now: u64, drops: &mut DropTally) -> usize {
        let s = &*self.shared;
        let Some((m, q)) = s.members.member_of(queue) else {
            return 0;
        };
        let member = &s.members.members()[m];
        let n = member.dev.rx_burst(q, pkts, now, drops);
        if n == 0 {
            return 0;
        }
        let active = s.active.load(Ordering::Relaxed) == m;
        let takes = member.up() && (active || s.mode != BondMode::ActiveBackup);
        let slb = s.mode == BondMode::BalanceSlb;
        let now_s = if slb { s.secs() } else { 0 };
        let c = &s.counters[m];
        let mut kept = 0;
        let mut dropped = 0u32;
        for i in 0..n {
            let f = pkts[i].frame();
            if is_lacpdu(f) {
                // Consumed by the bond, never forwarded.
                c.lacp_rx.fetch_add(1, Ordering::Relaxed);
                if s.lacp {
                    if let Ok((_, pdu)) = Lacpdu::parse_frame(f) {
                        if let Err(TrySendError::Full(_)) =
                            self.events.try_send(Event::Lacpdu(m, pdu))
                        {
                            drops.count(DropReason::SlowProtocols);
                        }
                    }
                }
                continue;
            }
            // Other link-local frames go on to the pipeline's link-local stage as every
            // port's do; an LLDPDU is taken by the member's agent first when the bond runs
            // LLDP (whatever the member's role: LLDP is per link).
            let link_local = f.len() >= 6 && f[..5] == [0x01, 0x80, 0xc2, 0, 0] && f[5] < 0x10;
            if link_local && f[5] == 0x0e {
                if let Some(Some(agent)) = self.lldp.get(m) {
                    agent.on_frame(f, now);
                    continue;
                }
            }
            let keep = link_local
                || (takes
                    && !(slb
                        && f.len() >= 12
                        && ((f[0] & 1 == 1 && !active) || s.is_local(&f[6..12], now_s))));
            if keep {
                pkts.swap(kept, i);
                kept += 1;
            } else {
                dropped += 1;
            }
        }
        if dropped > 0 {
            drops.count_n(DropReason::BondInactive, dropped);
            c.rx_dropped
                .fetch_add(u64::from(dropped), Ordering::Relaxed);
        }
        c.rx.fetch_add(kept as u64, Ordering::Relaxed);
        kept
    }

    fn tx_burst(
        &self,
        worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        drops: &mut DropTally,
    ) -> TxDone {
        let s = &*self.shared;
        if s.mode == BondMode::ActiveBackup {
            let a = s.active.load(Ordering::Relaxed);
            return match s.members.members().get(a).filter(|m| m.up()) {
                Some(member) => {
                    let done = member.dev.tx_burst(worker, pkts, sel, drops);
                    s.counters[a]
                        .tx
                        .fetch_add(u64::from(done.packets), Ordering::Relaxed);
                    done
                }
                None => {
                    drops.count_n(DropReason::LinkDown, sel.len() as u32);
                    TxDone::default()
                }
            };
        }
        let n = s.names.len();
        let mut per = [[0u8; 256]; MAX_MEMBERS];
        let mut count = [0usize; MAX_MEMBERS];
        let now_s = if s.mode == BondMode::BalanceSlb {
            s.secs()
        } else {
            0
        };
        for &i in sel {
            let Some(pkt) = pkts.get(usize::from(i)) else {
                continue;
            };
            let f = pkt.frame();
            let b = bucket(s.mode, f);
            let m = usize::from(s.buckets[b].load(Ordering::Relaxed));
            if m >= n || !s.members.members()[m].up() {
                drops.count(DropReason::LinkDown);
                continue;
            }
            s.bucket_bytes[b].fetch_add(f.len() as u64, Ordering::Relaxed);
            if s.mode == BondMode::BalanceSlb && f.len() >= 12 {
                s.remember_local(&f[6..12], now_s);
            }
            per[m][count[m]] = i;
            count[m] += 1;
        }
        let mut done = TxDone::default();
        for m in 0..n {
            if count[m] == 0 {
                continue;
            }
            let d = s.members.members()[m]
                .dev
                .tx_burst(worker, pkts, &per[m][..count[m]], drops);
            s.counters[m]
                .tx
                .fetch_add(u64::from(d.packets), Ordering::Relaxed);
            done.packets += d.packets;
            done.bytes += d.bytes;
        }
        done
    }

    fn rx_fd(&self, queue: u16) -> Option<std::os::fd::RawFd> {
        self.shared.members.rx_fd(queue)
    }

    fn rx_arm(&self, queue: u16) -> bool {
        self.shared.members.rx_arm(queue)
    }

    fn rx_dead(&self, queue: u16) -> bool {
        self.shared.members.rx_dead(queue)
    }

    fn offloads(&self) -> Vec<&'static str> {
        self.shared.members.offloads()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rarp_is_a_reverse_request_for_the_mac() {
        let mac = MacAddr([2, 0, 0, 0, 0, 7]);
        let f = rarp(mac, None);
        assert_eq!(f.len(), 60);
        assert_eq!(&f[..6], &[0xff; 6]);
        assert_eq!(&f[6..12], &mac.0);
        assert_eq!(&f[12..14], &[0x80, 0x35]);
        assert_eq!(&f[20..22], &[0, 3], "reverse request");
        assert_eq!(&f[22..28], &mac.0);
        let t = rarp(mac, Some(10));
        assert_eq!(&t[12..18], &[0x81, 0, 0, 10, 0x80, 0x35]);
    }

    #[test]
    fn balance_tcp_spreads_flows_over_buckets() {
        let mut seen = std::collections::HashSet::new();
        for port in 0..64u16 {
            let mut f = vec![0u8; 54];
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f[14] = 0x45;
            f[16..18].copy_from_slice(&40u16.to_be_bytes());
            f[22] = 64;
            f[23] = 6;
            f[26..30].copy_from_slice(&[10, 0, 0, 1]);
            f[30..34].copy_from_slice(&[10, 0, 0, 2]);
            f[34..36].copy_from_slice(&(1000 + port).to_be_bytes());
            f[36..38].copy_from_slice(&80u16.to_be_bytes());
            f[46] = 0x50;
            seen.insert(bucket(BondMode::BalanceTcp, &f));
        }
        assert!(seen.len() > 40, "{} buckets of 64 flows", seen.len());
    }
}
