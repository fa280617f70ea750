//! Reports built from the port table, the counters and the control state: `port list`,
//! `fdb`, `stats`, `placement` and `qos show`. They read; they change nothing.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use qswitch_api::request::{
    FdbEntry, KernelDrops, PlacementReport, PortInfo, PortStats, QueueInfo, QueuePlacementInfo,
    QueueStats, StatsReport, TapStats, VtepStats, VxlanStats, VxlanTraffic, WorkerPlacementInfo,
    WorkerStats,
};

use super::runtime::Reason;
use super::{Core, Switch};
use crate::control::qos;
use crate::ids::{PortId, WorkerId};
use crate::port::vxlan::{RemoteMac, TrafficStats, VxlanPort};
use crate::port::{Device, Port};
use crate::stats::{DropCounters, DropReason};
use crate::table::{PortEntry, PortTable};

impl Switch {
    /// QoS settings, allocations and measured rates of every port.
    pub fn qos_show(&self) -> qswitch_api::request::QosReport {
        qos::ops::report(&self.shared)
    }

    /// The vhost-user event loop's watchdog so far: its ticks, and the ports they looked at
    /// in all. Only ports a frontend connected to are looked at, so with none connected
    /// (and no guest ever signalled) there are no ticks at all.
    pub fn vhost_watchdog_looks(&self) -> (u64, u64) {
        self.drivers.vhost.watchdog_looks()
    }

    /// [`Switch::qos_show`] of the ports with QoS settings, an uplink or a capacity only,
    /// without their per-second histories (empty): for a periodic sampler, whose cost then
    /// does not grow with the ports QoS leaves alone.
    pub fn qos_show_configured(&self) -> qswitch_api::request::QosReport {
        qos::ops::report_configured(&self.shared)
    }

    /// Ports as `port list` shows them.
    pub fn ports(&self) -> Vec<PortInfo> {
        let table = self.shared.ports.load_full();
        let ctl = self.control.lock();
        table
            .iter()
            .flatten()
            .map(|p| {
                let queues: Vec<QueueInfo> = ctl
                    .queues
                    .range((p.id, 0)..=(p.id, u16::MAX))
                    .filter_map(|(&(_, queue), st)| {
                        st.worker.map(|w| QueueInfo {
                            queue,
                            worker: w.0,
                            cpu: self.cpu_of(w).0,
                        })
                    })
                    .collect();
                let (created, mac) = match &p.dev {
                    Device::Tap(t) => (t.created(), None),
                    Device::Gen(g) => (false, Some(g.mac().to_string())),
                    _ => (false, None),
                };
                let vhost = match &p.dev {
                    Device::VhostUser(v) => Some(v),
                    _ => None,
                };
                let (xdp_mode, kernel) = match &p.dev {
                    Device::AfXdp(a) => {
                        let k = a.kernel_stats();
                        (
                            Some(a.mode_in_use().to_string()),
                            Some(KernelDrops {
                                rx_dropped: k.rx_dropped,
                                invalid_descs: k.invalid_descs,
                            }),
                        )
                    }
                    _ => (None, None),
                };
                let settings = &p.policy.load().settings;
                let (vlans, security, storm) = settings.to_config();
                let ll = settings.link_local;
                PortInfo {
                    vlans,
                    security,
                    storm,
                    owner: p.config.owner.as_deref().cloned(),
                    link_local_forward: (!ll.forward.is_empty()).then_some(ll.forward),
                    bpdu_guard: ll.bpdu_guard,
                    disabled: p.disabled.get().then(|| "bpdu_guard".to_string()),
                    name: p.config.name.clone(),
                    kind: p.config.kind.to_string(),
                    ifname: p.config.ifname().map(ToString::to_string),
                    vlan: p.config.vlan.map(u16::from),
                    mac,
                    created,
                    offloads: p.dev.offloads().into_iter().map(String::from).collect(),
                    socket: p.config.socket().map(ToString::to_string),
                    mode: vhost.and(p.config.vhost_mode()).map(|m| m.to_string()),
                    connected: vhost.map(|v| v.connected()),
                    enabled_queues: vhost.map(|v| v.enabled_pairs()),
                    dirty_log: vhost.map(|v| v.dirty_logging()),
                    queues,
                    xdp_mode,
                    inner_mtu: match &p.dev {
                        Device::Vxlan(v) => Some(v.inner_mtu()),
                        _ => None,
                    },
                    kernel,
                    fastpath: match &p.dev {
                        Device::Veth(_) => Some(super::drivers::eligible(p).is_some()),
                        _ => None,
                    },
                    waiting: None,
                }
            })
            .chain(ctl.waiting.iter().map(waiting_info))
            .collect()
    }

    /// The MAC learning table, with port names; MACs behind a VXLAN port carry their VTEP
    /// and origin, and the port's remote MACs the switch has not seen yet (static and EVPN
    /// entries) are listed too.
    pub fn fdb(&self) -> Vec<FdbEntry> {
        let table = self.shared.ports.load_full();
        let mut remote: BTreeMap<(String, String), RemoteMac> = BTreeMap::new();
        let mut vlans: BTreeMap<String, u16> = BTreeMap::new();
        for p in table.iter().flatten() {
            if let Device::Vxlan(v) = &p.dev {
                vlans.insert(p.config.name.clone(), p.config.vlan_id());
                for r in v.entries() {
                    remote.insert((p.config.name.clone(), r.mac.to_string()), r);
                }
            }
        }
        let mut out: Vec<FdbEntry> = self
            .shared
            .fdb
            .entries(self.shared.now())
            .into_iter()
            .filter_map(|l| {
                let port = table.get(usize::from(l.port.0))?.as_ref()?;
                let mac = l.mac.to_string();
                let r = remote.remove(&(port.config.name.clone(), mac.clone()));
                Some(FdbEntry {
                    mac,
                    vlan: l.vlan,
                    port: port.config.name.clone(),
                    age_ms: l.age_ns / 1_000_000,
                    vtep: r.map(|r| r.vtep.to_string()),
                    origin: r.map(|r| r.origin.name().to_string()),
                })
            })
            .collect();
        out.extend(remote.into_iter().map(|((port, mac), r)| FdbEntry {
            mac,
            vlan: vlans.get(&port).copied().unwrap_or(0),
            port,
            age_ms: r.age_ns / 1_000_000,
            vtep: Some(r.vtep.to_string()),
            origin: Some(r.origin.name().to_string()),
        }));
        out
    }

    /// The VXLAN ports: name, the VLAN they carry (0: untagged) and the device, for the
    /// control plane that programs their remote tables (EVPN).
    pub fn vxlan_ports(&self) -> Vec<(String, u16, Arc<VxlanPort>)> {
        let table = self.shared.ports.load_full();
        table
            .iter()
            .flatten()
            .filter_map(|p| match &p.dev {
                Device::Vxlan(v) => Some((p.config.name.clone(), p.config.vlan_id(), v.clone())),
                _ => None,
            })
            .collect()
    }

    /// All counters now (rates are left to the caller, who keeps the previous report).
    pub fn stats(&self) -> StatsReport {
        let table = self.shared.ports.load_full();
        let fast = self.drivers.veth.current();
        let ports = table
            .iter()
            .flatten()
            .map(|p| port_stats(p, fast.as_deref(), &self.shared.fdb))
            .collect();
        StatsReport {
            ports,
            ..self.stats_of_workers(Some(&table))
        }
    }

    /// [`Switch::stats`] without the ports, and without the workers' queue lists: for a
    /// periodic sampler in a second when nothing moved ([`Core::activity`] stood still,
    /// the same [`Switch::epoch`], no kernel forwarding), whose ports' counters are then
    /// those of its last full report. Costs nothing per port.
    pub fn stats_quiet(&self) -> StatsReport {
        self.stats_of_workers(None)
    }

    /// The switch's epoch: it moves with every change published to the workers (a port
    /// added or removed, a policy set, a queue moved).
    pub fn epoch(&self) -> u64 {
        self.shared.epoch()
    }

    /// A count that moves with every QoS settings change (`qos set`), which publishes
    /// nothing to the workers and so leaves [`Switch::epoch`] alone.
    pub fn qos_generation(&self) -> u64 {
        self.shared.qos.settings_gen.load(Ordering::Acquire)
    }

    /// Whether the kernel forwards some ports' frames by itself (the veth fast path), which
    /// [`Core::activity`] does not see.
    pub fn kernel_forwards(&self) -> bool {
        self.drivers.veth.current().is_some()
    }

    /// The report's switch-wide part: uptime, process CPU and the workers, with their queue
    /// lists when `table` is given.
    fn stats_of_workers(&self, table: Option<&PortTable>) -> StatsReport {
        let mut owners: BTreeMap<(PortId, u16), WorkerId> = BTreeMap::new();
        if table.is_some() {
            for w in &self.workers {
                for (e, q) in w.queues.load().iter() {
                    owners.insert((e.id, *q), w.id);
                }
            }
        }
        let workers = self
            .workers
            .iter()
            .map(|w| {
                let c = &w.counters;
                let tid = c.tid.load(Ordering::Relaxed);
                let (vol, invol) = if tid > 0 {
                    qswitch_sys::thread::ctx_switches(tid).unwrap_or_default()
                } else {
                    (0, 0)
                };
                WorkerStats {
                    id: w.id.0,
                    cpu: w.cpu.0,
                    tid,
                    queues: owners
                        .iter()
                        .filter(|(_, &o)| o == w.id)
                        .filter_map(|((p, q), _)| {
                            table?
                                .get(usize::from(p.0))?
                                .as_ref()
                                .map(|e| format!("{}/{q}", e.config.name))
                        })
                        .collect(),
                    busy_polls: c.busy_polls.get(),
                    idle_polls: c.idle_polls.get(),
                    busy_ns: c.busy_ns.get(),
                    idle_ns: c.idle_ns.get(),
                    sleeps: c.sleeps.get(),
                    wakeups: c.wakeups.get(),
                    spin_us: c.spin_ns.get() as f64 / 1000.0,
                    voluntary_ctx_switches: vol,
                    involuntary_ctx_switches: invol,
                    cpu_ns: if tid > 0 {
                        qswitch_sys::thread::thread_cpu_ns(tid).unwrap_or(0)
                    } else {
                        0
                    },
                }
            })
            .collect();
        StatsReport {
            uptime_ms: self.shared.now() / 1_000_000,
            process_cpu_ns: qswitch_sys::thread::process_cpu_ns(),
            ports: Vec::new(),
            workers,
            rates: None,
        }
    }
}

impl Core {
    /// Where every queue runs, its load and why; per-worker load; warnings; recent moves.
    pub fn placement(&self) -> PlacementReport {
        let mut ctl = self.control.lock();
        self.refresh_plan(&mut ctl);
        let table = self.shared.ports.load_full();
        let cpu = |w: Option<WorkerId>| w.map(|w| self.cpu_of(w).0);
        let queues = ctl
            .queues
            .iter()
            .filter_map(|(&(p, q), st)| {
                let entry = table.get(usize::from(p.0))?.as_ref()?;
                let (state, why) = match &st.reason {
                    Reason::Pinned => ("pinned", "pinned by the operator".to_string()),
                    Reason::Home => ("home", ctl.why(st)),
                    Reason::Coalesced { total } => (
                        "coalesced",
                        format!(
                            "coalesced at low load (all queues together {:.1}% of a core); \
                             home: {}",
                            total * 100.0,
                            ctl.why(st)
                        ),
                    ),
                    Reason::Paired { with } => (
                        "paired",
                        format!(
                            "paired with {with}, which carries the other direction of its \
                             traffic; home: {}",
                            ctl.why(st)
                        ),
                    ),
                    Reason::Spread { cpu, busy } => (
                        "spread",
                        format!(
                            "spread off CPU {cpu} ({:.0}% busy); home: {}",
                            busy * 100.0,
                            ctl.why(st)
                        ),
                    ),
                };
                Some(QueuePlacementInfo {
                    port: entry.config.name.clone(),
                    queue: q,
                    worker: st.worker.map(|w| w.0),
                    cpu: cpu(st.worker),
                    home_cpu: cpu(st.home),
                    load: st.load,
                    state: state.to_string(),
                    why,
                })
            })
            .collect();
        let workers = self
            .workers
            .iter()
            .map(|w| WorkerPlacementInfo {
                id: w.id.0,
                cpu: w.cpu.0,
                busy: ctl.worker_busy.get(w.id.0).copied().unwrap_or(0.0),
                queues: ctl.published.get(w.id.0).map_or(0, Vec::len),
            })
            .collect();
        PlacementReport {
            mode: ctl.mode.to_string(),
            reserved_cpus: self.reserved.clone(),
            queues,
            workers,
            port_sets: ctl.port_sets.clone(),
            warnings: ctl.plan_warnings(),
            moves: ctl.moves.iter().cloned().collect(),
            moves_total: ctl.moves_total,
        }
    }
}

fn drop_map(
    counters: impl Iterator<Item = impl std::ops::Deref<Target = DropCounters>>,
) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for c in counters {
        for &r in DropReason::ALL {
            let n = c.get(r);
            if n > 0 {
                *m.entry(r.name().to_string()).or_insert(0) += n;
            }
        }
    }
    m
}

fn port_stats(
    p: &PortEntry,
    fast: Option<&crate::port::veth::FastPath>,
    fdb: &crate::fdb::Fdb,
) -> PortStats {
    let f = fdb.port_stats(p.id);
    let fdb = Some(qswitch_api::request::PortFdbStats {
        entries: f.entries,
        limit: f.limit,
        limit_refused: f.limit_refused,
        flaps: f.flaps,
        moves_held: f.moves_held,
    });
    let c = &p.counters;
    let queues: Vec<QueueStats> =
        c.rx.iter()
            .enumerate()
            .map(|(q, qc)| QueueStats {
                queue: q as u16,
                rx_packets: qc.rx_packets.get(),
                rx_bytes: qc.rx_bytes.get(),
                drops: drop_map(std::iter::once(&qc.drops)),
            })
            .collect();
    let (sink, generated) = match &p.dev {
        Device::Gen(g) => (Some(g.sink_stats()), Some(g.generated())),
        _ => (None, None),
    };
    let (guest_errors, logged_pages, announces) = match &p.dev {
        Device::VhostUser(v) => (
            Some(v.guest_errors()),
            Some(v.logged_pages()),
            Some(v.announces()),
        ),
        _ => (None, None, None),
    };
    let vxlan = match &p.dev {
        Device::Vxlan(v) => Some(vxlan_stats(&v.stats())),
        _ => None,
    };
    let tap = match &p.dev {
        Device::Tap(t) => {
            let s = t.stats();
            Some(TapStats {
                gro_frames: s.gro_frames,
                gro_segments: s.gro_segments,
            })
        }
        _ => None,
    };
    let fastpath = match (&p.dev, fast) {
        (Device::Veth(_) | Device::Vxlan(_), Some(fp)) => Some(fp.counters(p.id)),
        _ => None,
    };
    let f = fastpath.unwrap_or_default();
    PortStats {
        name: p.config.name.clone(),
        rx_packets: queues.iter().map(|q| q.rx_packets).sum::<u64>() + f.rx_packets,
        rx_bytes: queues.iter().map(|q| q.rx_bytes).sum::<u64>() + f.rx_bytes,
        tx_packets: c.tx.iter().map(|t| t.tx_packets.get()).sum::<u64>() + f.tx_packets,
        tx_bytes: c.tx.iter().map(|t| t.tx_bytes.get()).sum::<u64>() + f.tx_bytes,
        fastpath,
        drops: drop_map(
            c.rx.iter()
                .map(|q| &q.drops)
                .chain(c.tx.iter().map(|t| &t.drops)),
        ),
        queues,
        sink,
        generated,
        guest_errors,
        logged_pages,
        announces,
        vxlan,
        tap,
        fdb,
        bond: match &p.dev {
            Device::Bond(b) => Some(b.info()),
            _ => None,
        },
    }
}

fn traffic(t: &TrafficStats) -> VxlanTraffic {
    VxlanTraffic {
        rx_packets: t.rx_frames,
        rx_bytes: t.rx_bytes,
        tx_packets: t.tx_frames,
        tx_bytes: t.tx_bytes,
    }
}

fn vxlan_stats(s: &crate::port::vxlan::VxlanStats) -> VxlanStats {
    VxlanStats {
        vni: s.vni,
        traffic: traffic(&s.traffic),
        vteps: s
            .vteps
            .iter()
            .map(|(ip, t)| VtepStats {
                vtep: ip.to_string(),
                traffic: traffic(t),
            })
            .collect(),
        other_vteps: traffic(&s.other_vteps),
        learned: s.learned,
        learn_refused: s.learn_refused,
        moves_held: s.moves_held,
        flaps: s.flaps,
        drops: s.drops.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        segmented: s.segmented,
        gso_sent: s.gso_sent,
        udp_gro: s.udp_gro,
        gro_frames: s.gro_frames,
        gro_segments: s.gro_segments,
    }
}

/// A waiting port ([`Switch::add_ports_or_wait`]) as `port list` shows it: its config, no
/// queue, and the interface it waits for.
fn waiting_info(c: &qswitch_api::PortConfig) -> PortInfo {
    PortInfo {
        name: c.name.clone(),
        kind: c.kind.to_string(),
        ifname: c.ifname().map(ToString::to_string),
        vlan: c.vlan.map(u16::from),
        mac: None,
        created: false,
        offloads: Vec::new(),
        socket: None,
        mode: None,
        connected: None,
        enabled_queues: None,
        dirty_log: None,
        queues: Vec::new(),
        xdp_mode: None,
        inner_mtu: None,
        kernel: None,
        fastpath: None,
        vlans: c.vlans.clone(),
        security: c.security.as_deref().cloned(),
        storm: c.storm.as_deref().cloned(),
        owner: c.owner.as_deref().cloned(),
        link_local_forward: None,
        bpdu_guard: false,
        disabled: None,
        waiting: c.ifname().map(ToString::to_string),
    }
}
