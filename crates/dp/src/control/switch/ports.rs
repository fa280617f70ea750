//! The port lifecycle: add (validate, open, admit, place, publish), remove, and live QoS
//! and policy settings. Every change here runs under the switch's one control lock.
//!
//! # Where a port's settings live
//! Once, in its table entry: the keys fixed when it was added in [`PortEntry::config`]
//! (its live-changeable keys cleared there), its VLAN trunk, security, storm and link-local
//! keys in its compiled [`Policy`], its QoS settings in its [`qos::PortQos`]. A port's
//! configuration as it runs ([`Switch::port_configs`]) is put together from these; nothing
//! else keeps a copy. A change that must be recorded (the daemon's state file) takes a
//! [`Record`]: it is called with the port configurations the change will leave, once the
//! change has passed every check and before anything is published, so a change that cannot
//! be recorded is refused whole and nothing needs undoing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use qswitch_api::{PortConfig, PortKind, QosSettings};

use super::{Switch, SwitchError, MAX_PORTS};
use crate::control::qos;
use crate::fdb::DEFAULT_PORT_LIMIT;
use crate::ids::PortId;
use crate::policy::{Policy, PortPolicy};
use crate::port::afxdp::AfXdpPort;
use crate::port::gen::GenPort;
use crate::port::tap::TapPort;
use crate::port::veth::{VethError, VethPort};
use crate::port::vhost_user::{VhostUserError, VhostUserPort};
use crate::port::vxlan::VxlanPort;
use crate::port::Device;
use crate::stats::PortCounters;
use crate::table::{Disabled, PortEntry, PortTable};

/// Records the port configurations a change leaves (what [`Switch::port_configs`] returns
/// once it is published). Called under the control lock after every check of the change and
/// before anything of it is published; an error (its message) refuses the change, and
/// nothing changes ([`SwitchError::NotRecorded`]).
pub type Record<'a> = dyn FnMut(&[PortConfig]) -> Result<(), String> + 'a;

/// A change checked but not published yet, as [`port_configs`] shows it.
enum Pending<'a> {
    Nothing,
    Policy(&'a str, &'a PortPolicy),
    Qos(&'a str, QosSettings),
}

/// `config` without the keys a live change sets (policy and QoS): those live in the entry's
/// [`Policy`] and [`qos::PortQos`] only.
/// The LLDP agent of a port whose `lldp` is `rx` or `both` (see [`crate::lldp`]): the
/// interface's MAC address and first global address are read once, as the port is added.
fn lldp_agent(config: &PortConfig, now: u64) -> Option<crate::lldp::LldpAgent> {
    let mode = config.lldp_mode();
    if mode == qswitch_api::config::LldpMode::Off {
        return None;
    }
    lldp_agent_on(config.lldp_ifname()?, mode, now)
}

/// The LLDP agent on interface `ifname` in `mode` (a port's, or a bond member's).
fn lldp_agent_on(
    ifname: &str,
    mode: qswitch_api::config::LldpMode,
    now: u64,
) -> Option<crate::lldp::LldpAgent> {
    let sys = |what: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{ifname}/{what}"))
            .map(|s| s.trim().to_string())
            .ok()
    };
    let mac = sys("address")
        .and_then(|m| m.parse::<qswitch_wire::MacAddr>().ok())
        .unwrap_or(qswitch_wire::MacAddr([0x02, 0, 0, 0, 0, 0]));
    let management = sys("ifindex")
        .and_then(|i| i.parse::<u32>().ok())
        .and_then(|i| {
            qswitch_sys::rtnl::Rtnl::open()
                .and_then(|mut r| r.global_addresses(i))
                .ok()
        })
        .and_then(|a| a.first().copied());
    crate::lldp::LldpAgent::new(
        ifname,
        mode,
        mac,
        management,
        crate::lldp::Identity::of_host(mac),
        now,
    )
}

fn fixed(config: &PortConfig) -> PortConfig {
    let mut c = config.clone();
    PortPolicy::default().write_config(&mut c);
    c.qos = None;
    c
}

/// A port's configuration as it runs: its fixed keys with `policy` and `qos` written in.
fn settings(p: &PortEntry, policy: &PortPolicy, qos: QosSettings) -> PortConfig {
    let mut c = p.config.clone();
    policy.write_config(&mut c);
    c.qos = qos.to_config();
    // A bond's queues are its members' (set when it opened), not a key: as configured.
    if matches!(c.kind, PortKind::Bond(_)) {
        c.queues = 1;
    }
    c
}

/// The configurations of the ports of `table` (in slot order), then of the waiting ports,
/// with `pending` applied.
fn port_configs(
    table: &PortTable,
    waiting: &[PortConfig],
    pending: Pending<'_>,
) -> Vec<PortConfig> {
    table
        .iter()
        .flatten()
        .map(|p| {
            let name = p.config.name.as_str();
            let policy = p.policy.load();
            match pending {
                Pending::Policy(n, pol) if n == name => settings(p, pol, p.qos.settings()),
                Pending::Qos(n, q) if n == name => settings(p, &policy.settings, q),
                _ => settings(p, &policy.settings, p.qos.settings()),
            }
        })
        .chain(waiting.iter().cloned())
        .collect()
}

impl Switch {
    /// Each port's configuration as it runs: what it was added with, its policy keys
    /// (`vlans`, `security`, `storm`, `link_local_forward`, `bpdu_guard`) and its `qos` as
    /// last set live; the ports waiting for their interface last.
    pub fn port_configs(&self) -> Vec<PortConfig> {
        let ctl = self.control.lock();
        port_configs(
            &self.shared.ports.load_full(),
            &ctl.waiting,
            Pending::Nothing,
        )
    }

    /// Adds a port from its config: validates it, opens the device, assigns its rx queues
    /// to the least-loaded workers, and publishes it.
    pub fn add_port(&self, config: &PortConfig) -> Result<PortId, SwitchError> {
        self.add_ports(std::slice::from_ref(config))
            .map(|ids| ids[0])
    }

    /// [`Switch::add_port`], recorded by `record` before it is published (see [`Record`]).
    pub fn add_port_recorded(
        &self,
        config: &PortConfig,
        record: &mut Record<'_>,
    ) -> Result<PortId, SwitchError> {
        let mut ctl = self.control.lock();
        self.add_ports_locked(&mut ctl, std::slice::from_ref(config), Some(record))
            .map(|ids| ids[0])
    }

    /// Adds several ports at once: they all appear to the workers in the same instant, so
    /// no frame is switched while only some of them exist. All or nothing: if one fails,
    /// none is added (devices already opened are closed again).
    pub fn add_ports(&self, configs: &[PortConfig]) -> Result<Vec<PortId>, SwitchError> {
        let mut ctl = self.control.lock();
        self.add_ports_locked(&mut ctl, configs, None)
    }

    /// [`Switch::add_ports`] at start-up: a veth or afxdp port whose interface does not
    /// exist (a tenant deleted it, or its container or NIC driver comes later) does not keep
    /// the others from starting. It is kept as *waiting*: listed by [`Switch::ports`] with
    /// the interface it waits for, in no table, switching nothing, until
    /// [`Switch::attach_waiting`] finds its interface. Returns the names of the waiting ports.
    pub fn add_ports_or_wait(&self, configs: &[PortConfig]) -> Result<Vec<String>, SwitchError> {
        let mut ctl = self.control.lock();
        let (wait, now): (Vec<PortConfig>, Vec<PortConfig>) = configs
            .iter()
            .cloned()
            .partition(|c| waits_for(c).is_some_and(|i| !qswitch_sys::netif::exists(i)));
        for c in &wait {
            c.validate()?;
        }
        self.add_ports_locked(&mut ctl, &now, None)?;
        let names = wait.iter().map(|c| c.name.clone()).collect();
        for c in wait {
            tracing::warn!(
                port = %c.name,
                ifname = waits_for(&c).unwrap_or_default(),
                "port down: waiting for its interface"
            );
            ctl.waiting.push(c);
        }
        Ok(names)
    }

    /// Opens the waiting ports ([`Switch::add_ports_or_wait`]) whose interface exists now;
    /// one that still cannot open (a driver not ready yet) keeps waiting. Returns how many
    /// are still waiting.
    pub fn attach_waiting(&self) -> usize {
        let mut ctl = self.control.lock();
        let waiting = std::mem::take(&mut ctl.waiting);
        for c in waiting {
            let ifname = waits_for(&c).unwrap_or_default();
            if !qswitch_sys::netif::exists(ifname) {
                ctl.waiting.push(c);
                continue;
            }
            match self.add_ports_locked(&mut ctl, std::slice::from_ref(&c), None) {
                Ok(_) => tracing::info!(port = %c.name, ifname, "interface appeared: port up"),
                Err(e) => {
                    tracing::warn!(port = %c.name, ifname, error = %e, "interface appeared but the port cannot open yet");
                    ctl.waiting.push(c);
                }
            }
        }
        ctl.waiting.len()
    }

    fn add_ports_locked(
        &self,
        ctl: &mut super::runtime::Control,
        configs: &[PortConfig],
        record: Option<&mut Record<'_>>,
    ) -> Result<Vec<PortId>, SwitchError> {
        let table = self.shared.ports.load_full();
        let mut new_table = (*table).clone();
        let mut ids = Vec::with_capacity(configs.len());
        // Refused before any device is opened: thousands of sockets bound and closed again.
        if new_table.iter().flatten().count() + configs.len() > MAX_PORTS {
            return Err(SwitchError::Full);
        }
        let mut taken = Taken::of(&new_table);
        // Free slots are looked for from the last one taken: a batch of N ports is O(N).
        let mut free_from = 0;
        for config in configs {
            for w in &ctl.waiting {
                if w.name == config.name {
                    return Err(SwitchError::PortExists(config.name.clone()));
                }
                if let Some(ifname) = config
                    .ifnames()
                    .into_iter()
                    .find(|i| w.ifnames().contains(i))
                {
                    return Err(SwitchError::IfnameInUse {
                        ifname: ifname.to_string(),
                        port: w.name.clone(),
                    });
                }
            }
            let id = self.prepare(&new_table, &taken, config, free_from)?;
            free_from = usize::from(id.0) + 1;
            if let Some(group) = config
                .security_groups
                .iter()
                .find(|g| !ctl.security_groups.iter().any(|s| &s.name == *g))
            {
                return Err(qswitch_api::ConfigError::UnknownGroup {
                    port: config.name.clone(),
                    group: group.clone(),
                }
                .into());
            }
            let dev = self.open_device(id, config)?;
            let slot = usize::from(id.0);
            if slot == new_table.len() {
                new_table.push(None);
            }
            // An afxdp port has the queues the interface gave it (its default is all of them;
            // the packet mode has one).
            let config = match &dev {
                Device::AfXdp(a) => &PortConfig {
                    queues: a.queues(),
                    ..config.clone()
                },
                // A bond has its members' queues.
                Device::Bond(b) => &PortConfig {
                    queues: b.queues(),
                    ..config.clone()
                },
                _ => config,
            };
            new_table[slot] = Some(self.entry(id, config, dev));
            taken.hold(config);
            ids.push(id);
        }
        qos::ops::admit(&new_table, self.shared.qos.reservable, None, None)
            .map_err(SwitchError::Qos)?;
        if let Some(record) = record {
            record(&port_configs(&new_table, &ctl.waiting, Pending::Nothing))
                .map_err(SwitchError::NotRecorded)?;
        }
        for (&id, config) in ids.iter().zip(configs) {
            if let Some(limit) = config.security.as_ref().and_then(|s| s.mac_limit) {
                self.shared.fdb.set_port_limit(id, limit);
            }
        }
        // The new ports' rules are in force before the workers see the ports.
        self.compile_firewall(ctl, &new_table);
        self.replan(ctl, &new_table);
        self.apply(ctl, Some(new_table));
        self.sync_fastpath(self.shared.now());
        for c in configs {
            tracing::info!(port = %c.name, kind = %c.kind, "port added");
        }
        Ok(ids)
    }

    /// Checks that `config` can join `table`, whose ports hold what `taken` lists, and
    /// returns the id it gets: the first free slot from `free_from` on (no slot before it
    /// is free).
    fn prepare(
        &self,
        table: &PortTable,
        taken: &Taken,
        config: &PortConfig,
        free_from: usize,
    ) -> Result<PortId, SwitchError> {
        config.validate()?;
        taken.check(config)?;
        let slot = table
            .iter()
            .skip(free_from)
            .position(Option::is_none)
            .map_or(table.len(), |i| free_from + i);
        if slot >= MAX_PORTS {
            return Err(SwitchError::Full);
        }
        Ok(PortId(slot as u16))
    }

    /// Adds a test double port (see [`crate::port::inject`]).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn add_inject_port(
        &self,
        name: &str,
        vlan: Option<u16>,
    ) -> Result<Arc<crate::port::inject::InjectPort>, SwitchError> {
        let mut config = PortConfig::gen(name);
        config.vlan = vlan
            .map(qswitch_api::VlanId::try_from)
            .transpose()
            .map_err(|e| qswitch_api::ConfigError::Port {
                name: name.to_string(),
                problem: e.into(),
            })?;
        self.add_inject_port_config(&config)
    }

    /// Adds a test double port (see [`crate::port::inject`]) with `config`'s name, VLAN,
    /// policy keys and security groups (its kind is ignored).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn add_inject_port_config(
        &self,
        config: &PortConfig,
    ) -> Result<Arc<crate::port::inject::InjectPort>, SwitchError> {
        let mut ctl = self.control.lock();
        let mut table = (*self.shared.ports.load_full()).clone();
        let config = PortConfig {
            kind: PortConfig::gen(&config.name).kind,
            ..config.clone()
        };
        let id = self.prepare(&table, &Taken::of(&table), &config, 0)?;
        let port = Arc::new(crate::port::inject::InjectPort::new());
        let slot = usize::from(id.0);
        if slot == table.len() {
            table.push(None);
        }
        table[slot] = Some(self.entry(id, &config, Device::Inject(port.clone())));
        self.compile_firewall(&ctl, &table);
        self.replan(&mut ctl, &table);
        self.apply(&mut ctl, Some(table));
        Ok(port)
    }

    fn open_device(&self, id: PortId, config: &PortConfig) -> Result<Device, SwitchError> {
        Ok(match &config.kind {
            PortKind::Tap(t) => Device::Tap(TapPort::open(t.ifname.as_str(), config.queues)?),
            PortKind::VhostUser(v) => Device::VhostUser(VhostUserPort::new(
                &config.name,
                v.socket.as_path(),
                v.mode,
                config.queues,
                &self
                    .drivers
                    .vhost
                    .reactor(&self.shared, &self.workers)
                    .map_err(VhostUserError::Setup)?,
            )?),
            PortKind::Vxlan(v) => Device::Vxlan(Arc::new(VxlanPort::open(
                &config.name,
                v,
                &self.drivers.vxlan,
            )?)),
            PortKind::AfXdp(a) => Device::AfXdp(
                AfXdpPort::open(&config.name, a.ifname.as_str(), a.queues, a.mode).map_err(
                    |error| SwitchError::AfXdp {
                        port: config.name.clone(),
                        error,
                    },
                )?,
            ),
            PortKind::Veth(v) => {
                let fp = if v.fastpath {
                    Some(
                        self.drivers
                            .veth
                            .fastpath()
                            .map_err(|source| SwitchError::Veth {
                                port: config.name.clone(),
                                error: VethError::Setup {
                                    what: "creating the fast path's maps",
                                    ifname: v.ifname.to_string(),
                                    source,
                                },
                            })?,
                    )
                } else {
                    None
                };
                Device::Veth(
                    VethPort::open(
                        id,
                        v.ifname.as_str(),
                        config.queues,
                        config.vlan_id(),
                        fp.as_deref(),
                    )
                    .map_err(|error| SwitchError::Veth {
                        port: config.name.clone(),
                        error,
                    })?,
                )
            }
            PortKind::Bond(b) => self.open_bond(id, config, b)?,
            PortKind::Gen(g) => Device::Gen(GenPort::new(
                id,
                &config.name,
                g.mac,
                config.queues,
                g.generate.as_ref(),
                self.workers.len(),
            )),
        })
    }

    /// Opens a bond's members (each as a port of its own type, under the bond's id) and
    /// starts the bond. A member whose interface does not exist is an error (a bond does not
    /// wait for its members).
    fn open_bond(
        &self,
        id: PortId,
        config: &PortConfig,
        b: &qswitch_api::BondConfig,
    ) -> Result<Device, SwitchError> {
        let err = |error: String| SwitchError::Bond {
            port: config.name.clone(),
            error,
        };
        let mut devices = Vec::with_capacity(b.members.len());
        for m in &b.members {
            if !qswitch_sys::netif::exists(m.ifname.as_str()) {
                return Err(err(format!(
                    "member interface '{}' does not exist",
                    m.ifname
                )));
            }
            let mc = m.port().map_err(|e| err(e.to_string()))?;
            let dev = self
                .open_device(id, &mc)
                .map_err(|e| err(format!("member '{}': {e}", m.ifname)))?;
            let queues = match &dev {
                Device::AfXdp(a) => a.queues(),
                _ => mc.queues,
            };
            devices.push((dev, queues));
        }
        // The MACs a failover announces: those learned on the switch's local ports (not
        // uplinks), in the VLANs the bond carries, tagged as the bond carries them.
        let shared = Arc::downgrade(&self.shared);
        let announce: crate::port::bond::Announce = Box::new(move || {
            let Some(shared) = shared.upgrade() else {
                return Vec::new();
            };
            let table = shared.ports.load_full();
            let Some(bond) = table.iter().flatten().find(|p| p.id == id) else {
                return Vec::new();
            };
            let policy = bond.policy.load();
            let carried = policy.carried();
            let local = |p: PortId| {
                table.iter().flatten().any(|e| {
                    e.id == p
                        && e.id != id
                        && e.config.capacity.is_none()
                        && !matches!(e.dev, Device::AfXdp(_) | Device::Vxlan(_) | Device::Bond(_))
                })
            };
            shared
                .fdb
                .entries(shared.now())
                .into_iter()
                .filter(|l| local(l.port) && carried.carries(l.vlan))
                .map(|l| {
                    let tag = (carried.native != Some(l.vlan)).then_some(l.vlan);
                    (l.mac, tag)
                })
                .collect()
        });
        let mut bond = crate::port::bond::BondPort::open(&config.name, b, devices, announce)
            .map_err(|e| err(e.to_string()))?;
        // LLDP on a bond: one agent per member, on the member's own interface.
        let now = self.shared.now();
        bond.set_lldp(
            b.members
                .iter()
                .map(|m| lldp_agent_on(m.ifname.as_str(), config.lldp_mode(), now))
                .collect(),
        );
        Ok(Device::Bond(bond))
    }

    fn entry(&self, id: PortId, config: &PortConfig, dev: Device) -> Arc<PortEntry> {
        Arc::new(PortEntry {
            id,
            config: fixed(config),
            vlan: config.vlan_id(),
            dev,
            counters: PortCounters::new(usize::from(config.queues), self.workers.len()),
            qos: qos::PortQos::new(config, self.shared.now()),
            policy: ArcSwap::from_pointee(Policy::new(
                config.vlan.map(qswitch_api::VlanId::get),
                PortPolicy::from_config(config),
                self.shared.now(),
            )),
            capture: Default::default(),
            mirror: Default::default(),
            disabled: Disabled::new(self.shared.bpdu_trips.clone()),
            lldp: lldp_agent(config, self.shared.now()),
        })
    }

    /// Changes a port's VLAN trunk, port security and storm-control settings live: the
    /// port's entry gets the new policy (storm buckets start full), its MAC limit is set,
    /// its learned addresses are forgotten (they may belong to VLANs it no longer carries),
    /// and the table is republished, so each worker switches with the new policy from its
    /// next burst on.
    pub fn set_port_policy(&self, name: &str, policy: PortPolicy) -> Result<(), SwitchError> {
        self.change_port_policy(name, |p| *p = policy, None)
            .map(drop)
    }

    /// Applies a live change to a port's policy ([`Switch::set_port_policy`]), read and
    /// written under the control lock so that concurrent changes do not undo each other.
    /// Returns the new policy.
    pub fn update_port_policy(
        &self,
        name: &str,
        update: &qswitch_api::policy::PolicyUpdate,
    ) -> Result<PortPolicy, SwitchError> {
        self.change_port_policy(name, |p| p.update(update), None)
    }

    /// [`Switch::update_port_policy`], recorded by `record` before it is published (see
    /// [`Record`]).
    pub fn update_port_policy_recorded(
        &self,
        name: &str,
        update: &qswitch_api::policy::PolicyUpdate,
        record: &mut Record<'_>,
    ) -> Result<PortPolicy, SwitchError> {
        self.change_port_policy(name, |p| p.update(update), Some(record))
    }

    fn change_port_policy(
        &self,
        name: &str,
        change: impl FnOnce(&mut PortPolicy),
        record: Option<&mut Record<'_>>,
    ) -> Result<PortPolicy, SwitchError> {
        let mut ctl = self.control.lock();
        let table = self.shared.ports.load_full();
        let entry = table
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))?;
        let mut policy = entry.policy.load().settings.clone();
        change(&mut policy);
        if let Some(group) = (policy.security_groups.iter())
            .find(|g| !ctl.security_groups.iter().any(|s| &s.name == *g))
        {
            return Err(qswitch_api::ConfigError::UnknownGroup {
                port: name.to_string(),
                group: group.clone(),
            }
            .into());
        }
        let result = policy.clone();
        let limit = policy.security.mac_limit.unwrap_or(DEFAULT_PORT_LIMIT);
        let compiled = Arc::new(Policy::new(
            entry.config.vlan.map(qswitch_api::VlanId::get),
            policy,
            self.shared.now(),
        ));
        // A port that carries other VLANs may now be toward other uplinks: their
        // guarantees must still fit.
        qos::ops::admit(
            &table,
            self.shared.qos.reservable,
            None,
            Some((name, &compiled)),
        )
        .map_err(SwitchError::Qos)?;
        if let Some(record) = record {
            let pending = Pending::Policy(name, &compiled.settings);
            record(&port_configs(&table, &ctl.waiting, pending))
                .map_err(SwitchError::NotRecorded)?;
        }
        entry.policy.store(compiled);
        let id = entry.id;
        let new_table = (*table).clone();
        drop(table);
        // Its addresses may be a `remote_group`'s.
        self.compile_firewall(&ctl, &new_table);
        self.apply(&mut ctl, Some(new_table));
        self.shared.fdb.forget_port(id);
        self.shared.fdb.set_port_limit(id, limit);
        // A veth port given security groups leaves the kernel fast path now, not at the
        // next housekeeping tick (and one whose groups went returns to it).
        self.sync_fastpath(self.shared.now());
        tracing::info!(port = %name, "port policy set");
        Ok(result)
    }

    /// Enables a port that BPDU guard disabled ([`crate::link_local`]): its frames are
    /// switched again from the workers' next burst. Returns whether it was disabled.
    pub fn enable_port(&self, name: &str) -> Result<bool, SwitchError> {
        let _ctl = self.control.lock();
        let table = self.shared.ports.load_full();
        let entry = table
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))?;
        let was = entry.disabled.clear();
        if was {
            tracing::info!(port = %name, "port enabled");
        }
        Ok(was)
    }

    /// The bond ports (`name`: that one only), as `qswitch bond show` prints them.
    pub fn bonds(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<qswitch_api::bond::BondInfo>, SwitchError> {
        let table = self.shared.ports.load_full();
        let bonds: Vec<_> = table
            .iter()
            .flatten()
            .filter(|p| name.is_none_or(|n| p.config.name == n))
            .filter_map(|p| match &p.dev {
                Device::Bond(b) => Some(b.info()),
                _ => None,
            })
            .collect();
        match name {
            Some(n) if bonds.is_empty() => Err(SwitchError::Bond {
                port: n.to_string(),
                error: "no such bond".into(),
            }),
            _ => Ok(bonds),
        }
    }

    /// Makes `member` the active member of bond `name` (runtime state: a restart starts with
    /// the first member that carries traffic).
    pub fn set_bond_active(&self, name: &str, member: &str) -> Result<(), SwitchError> {
        let table = self.shared.ports.load_full();
        let p = table
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))?;
        let err = |error: String| SwitchError::Bond {
            port: name.to_string(),
            error,
        };
        match &p.dev {
            Device::Bond(b) => b.set_active(member).map_err(err)?,
            _ => return Err(err("not a bond".into())),
        }
        tracing::info!(port = %name, member, "bond active member set");
        Ok(())
    }

    /// A port's current policy settings.
    pub fn port_policy(&self, name: &str) -> Result<PortPolicy, SwitchError> {
        let table = self.shared.ports.load_full();
        table
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .map(|p| p.policy.load().settings.clone())
            .ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))
    }

    /// Changes a port's QoS settings live (effective at the next allocator tick), unless
    /// admission control refuses; a refused change changes nothing.
    pub fn qos_set(&self, name: &str, update: &qos::QosUpdate) -> Result<QosSettings, SwitchError> {
        let _ctl = self.control.lock();
        qos::ops::set(&self.shared, name, update, |_| Ok(()))
    }

    /// [`Switch::qos_set`], recorded by `record` before it takes effect (see [`Record`]).
    pub fn qos_set_recorded(
        &self,
        name: &str,
        update: &qos::QosUpdate,
        record: &mut Record<'_>,
    ) -> Result<QosSettings, SwitchError> {
        let ctl = self.control.lock();
        qos::ops::set(&self.shared, name, update, |new| {
            let table = self.shared.ports.load_full();
            record(&port_configs(&table, &ctl.waiting, Pending::Qos(name, new)))
                .map_err(SwitchError::NotRecorded)
        })
    }

    /// Removes a port. Returns once no worker uses it any more (its device is then closed:
    /// a TAP qswitch created disappears).
    pub fn del_port(&self, name: &str) -> Result<(), SwitchError> {
        self.del_port_locked(name, None)
    }

    /// [`Switch::del_port`], recorded by `record` before it is published (see [`Record`]).
    pub fn del_port_recorded(
        &self,
        name: &str,
        record: &mut Record<'_>,
    ) -> Result<(), SwitchError> {
        self.del_port_locked(name, Some(record))
    }

    fn del_port_locked(
        &self,
        name: &str,
        record: Option<&mut Record<'_>>,
    ) -> Result<(), SwitchError> {
        let mut ctl = self.control.lock();
        if let Some(i) = ctl.waiting.iter().position(|w| w.name == name) {
            if let Some(record) = record {
                let mut waiting = ctl.waiting.clone();
                waiting.remove(i);
                let table = self.shared.ports.load_full();
                record(&port_configs(&table, &waiting, Pending::Nothing))
                    .map_err(SwitchError::NotRecorded)?;
            }
            ctl.waiting.remove(i);
            tracing::info!(port = %name, "waiting port removed");
            return Ok(());
        }
        if let Some(m) = Self::mirror_using(&ctl.mirrors, name) {
            return Err(SwitchError::Mirror(format!(
                "port '{name}' is used by mirror '{m}'; remove the mirror first"
            )));
        }
        let table = self.shared.ports.load_full();
        let Some(entry) = table
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .cloned()
        else {
            return Err(SwitchError::NoSuchPort(name.to_string()));
        };
        let mut new_table = (*table).clone();
        new_table[usize::from(entry.id.0)] = None;
        while new_table.last().is_some_and(Option::is_none) {
            new_table.pop();
        }
        if let Some(record) = record {
            record(&port_configs(&new_table, &ctl.waiting, Pending::Nothing))
                .map_err(SwitchError::NotRecorded)?;
        }
        ctl.pins.retain(|(port, _), _| port != name);
        drop(table);
        self.replan(&mut ctl, &new_table);
        self.compile_firewall(&ctl, &new_table);
        self.apply(&mut ctl, Some(new_table));
        self.shared.fdb.remove_port(entry.id);
        // Its addresses leave the fast path before its programs go.
        self.sync_fastpath(self.shared.now());
        drop(ctl);
        // Wait (bounded) until the last worker reference is gone, so the device closes now.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Arc::strong_count(&entry) > 1 && Instant::now() < deadline && !self.stopping() {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Its connections go with it: its zone (its id) may be reused by a port added later.
        self.shared
            .firewall
            .flush(Some(u32::from(entry.id.0)), self.shared.now());
        tracing::info!(port = %name, "port removed");
        Ok(())
    }

    /// Puts in force the firewall's rules for the ports of `table` (each port's zone is its
    /// id).
    pub(super) fn compile_firewall(&self, ctl: &super::runtime::Control, table: &PortTable) {
        // With their policy keys: `security.ips` are the addresses of `remote_group`.
        let configs: Vec<Option<PortConfig>> = table
            .iter()
            .map(|p| {
                p.as_ref().map(|p| {
                    let mut c = p.config.clone();
                    p.policy.load().settings.write_config(&mut c);
                    c
                })
            })
            .collect();
        let ports: Vec<Option<&PortConfig>> = configs.iter().map(Option::as_ref).collect();
        let fw = &self.shared.firewall;
        let mut rules = crate::firewall::RuleSet::compile_ports(&ctl.security_groups, &ports);
        // Hits are the rule's, not its index's: they survive the recompile.
        rules.keep_hits(&fw.rules());
        fw.set_rules(rules);
    }

    /// The receive-side indirection table of a multi-queue port (vhost-user).
    pub fn reta(&self, name: &str) -> Result<Arc<crate::rss::Reta>, SwitchError> {
        let table = self.shared.ports.load_full();
        let p = table
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))?;
        match &p.dev {
            Device::VhostUser(v) => Ok(v.reta()),
            _ => Err(SwitchError::NoRss(name.to_string())),
        }
    }
}

/// The interface a port needs to exist before it can open: veth and afxdp ports, whose
/// interface someone else makes (a container runtime, a NIC driver).
fn waits_for(config: &PortConfig) -> Option<&str> {
    match &config.kind {
        PortKind::Veth(v) => Some(v.ifname.as_str()),
        PortKind::AfXdp(a) => Some(a.ifname.as_str()),
        _ => None,
    }
}

/// What the ports of a table hold that no other port may share: names, interfaces and
/// vhost-user sockets, each with the port holding it. Made once per batch of adds, so that
/// adding N ports at start-up is O(N): a scan of the table per added port made 4096
/// vhost-user ports take minutes to start.
#[derive(Default)]
struct Taken {
    names: std::collections::HashSet<String>,
    ifnames: std::collections::HashMap<String, String>,
    sockets: std::collections::HashMap<std::path::PathBuf, String>,
}

impl Taken {
    fn of(table: &PortTable) -> Taken {
        let mut t = Taken::default();
        for p in table.iter().flatten() {
            t.hold(&p.config);
        }
        t
    }

    fn hold(&mut self, c: &PortConfig) {
        self.names.insert(c.name.clone());
        for i in c.ifnames() {
            self.ifnames.insert(i.to_string(), c.name.clone());
        }
        if let Some(s) = c.socket() {
            let path: &std::path::Path = s.as_ref();
            self.sockets.insert(path.to_path_buf(), c.name.clone());
        }
    }

    fn check(&self, config: &PortConfig) -> Result<(), SwitchError> {
        if self.names.contains(&config.name) {
            return Err(SwitchError::PortExists(config.name.clone()));
        }
        for i in config.ifnames() {
            if let Some(port) = self.ifnames.get(&i.to_string()) {
                return Err(SwitchError::IfnameInUse {
                    ifname: i.to_string(),
                    port: port.clone(),
                });
            }
        }
        if let Some(socket) = config.socket() {
            let path: &std::path::Path = socket.as_ref();
            if let Some(port) = self.sockets.get(path) {
                return Err(SwitchError::SocketInUse {
                    socket: socket.to_string(),
                    port: port.clone(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qswitch_api::VhostMode;

    #[test]
    fn taken_names_interfaces_and_sockets_with_their_holder() {
        let mut t = Taken::default();
        let sock = |p: &str| p.parse().unwrap();
        t.hold(&PortConfig::gen("g"));
        t.hold(&PortConfig::tap("t", "qtap0".parse().unwrap()));
        t.hold(&PortConfig::vhost_user(
            "v",
            sock("/run/q/v.sock"),
            VhostMode::Server,
        ));
        assert!(t.check(&PortConfig::gen("h")).is_ok());
        let err = |c: &PortConfig| t.check(c).unwrap_err().to_string();
        assert_eq!(err(&PortConfig::gen("g")), "port 'g' already exists");
        assert!(err(&PortConfig::tap("u", "qtap0".parse().unwrap())).contains("'t'"));
        let other = PortConfig::vhost_user("w", sock("/run/q/v.sock"), VhostMode::Server);
        assert_eq!(
            err(&other),
            "socket '/run/q/v.sock' is already used by port 'v'"
        );
        let elsewhere = PortConfig::vhost_user("w", sock("/run/r/v.sock"), VhostMode::Server);
        assert!(t.check(&elsewhere).is_ok());
    }
}
