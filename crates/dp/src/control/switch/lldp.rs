//! LLDP in the running switch (see [`crate::lldp`]): the housekeeping thread ages each
//! agent's neighbours and sends what is due; `qswitch lldp` and `/metrics` read the agents.

use std::sync::Arc;

use qswitch_api::config::LldpMode;
use qswitch_api::request::LldpPort;

use super::{Core, Switch, SwitchError};
use crate::lldp::Identity;
use crate::packet::Pkt;
use crate::port::Port;
use crate::stats::DropTally;

impl Core {
    /// Every housekeeping tick: each agent forgets the neighbours whose TTL ran out; an agent
    /// with `lldp = "both"` takes the current host name (a change is sent at once) and sends
    /// its LLDPDU when due, by the port's transmit path (as worker 0, under its queue lock).
    /// Only the ports with an agent are looked at (listed once per port table).
    pub(super) fn lldp_tick(&self, ctl: &mut super::runtime::Control, now: u64) {
        let table = self.shared.ports.load_full();
        if !std::ptr::eq(ctl.lldp_slots.0.as_ptr(), Arc::as_ptr(&table)) {
            let slots = table
                .iter()
                .enumerate()
                .filter_map(|(slot, p)| {
                    let p = p.as_ref()?;
                    let bond = matches!(&p.dev, crate::port::Device::Bond(_));
                    (bond || p.lldp.is_some()).then_some(slot)
                })
                .collect();
            ctl.lldp_slots = (Arc::downgrade(&table), slots);
        }
        let mut name = None;
        for p in ctl
            .lldp_slots
            .1
            .iter()
            .filter_map(|&s| table.get(s)?.as_ref())
        {
            // A bond's members: each agent by its own member's device.
            if let crate::port::Device::Bond(bond) = &p.dev {
                for (ifname, agent) in bond.lldp_agents() {
                    agent.expire(now);
                    if agent.mode() != LldpMode::Both || p.disabled.get() {
                        continue;
                    }
                    let system_name = name.get_or_insert_with(crate::lldp::hostname).clone();
                    agent.set_identity_name(system_name, now);
                    if let Some(frame) = agent.due_tx(now) {
                        bond.send_by_member(ifname, &frame);
                    }
                }
            }
            let Some(agent) = &p.lldp else { continue };
            agent.expire(now);
            if agent.mode() != LldpMode::Both || p.disabled.get() {
                continue;
            }
            let system_name = name.get_or_insert_with(crate::lldp::hostname).clone();
            agent.set_identity_name(system_name, now);
            if let Some(frame) = agent.due_tx(now) {
                let mut pkt = Pkt::new();
                pkt.fill(&frame);
                let mut drops = DropTally::default();
                p.dev
                    .tx_burst(0, std::slice::from_mut(&mut pkt), &[0], &mut drops);
            }
        }
    }
}

impl Switch {
    /// The LLDP agents and their neighbours, in port order: of every port with LLDP, or of
    /// port `port` only (an error if there is no such port; empty if it runs no LLDP). A
    /// bond's members' agents are listed as `BOND/IFNAME`.
    pub fn lldp(&self, port: Option<&str>) -> Result<Vec<LldpPort>, SwitchError> {
        let table = self.shared.ports.load();
        if let Some(name) = port {
            if !table.iter().flatten().any(|p| p.config.name == name) {
                return Err(SwitchError::NoSuchPort(name.to_string()));
            }
        }
        let now = self.shared.now();
        Ok(table
            .iter()
            .flatten()
            .filter(|p| port.is_none_or(|n| p.config.name == n))
            .flat_map(|p| {
                let own = p.lldp.as_ref().map(|a| a.report(&p.config.name, now));
                // A bond's members, named `BOND/IFNAME`.
                let members: Vec<LldpPort> = match &p.dev {
                    crate::port::Device::Bond(bond) => bond
                        .lldp_agents()
                        .map(|(ifname, a)| a.report(&format!("{}/{ifname}", p.config.name), now))
                        .collect(),
                    _ => Vec::new(),
                };
                own.into_iter().chain(members)
            })
            .collect())
    }
}

impl crate::lldp::LldpAgent {
    /// [`Self::set_identity`] with a new host name and the chassis id kept.
    pub fn set_identity_name(&self, system_name: String, now: u64) {
        if let Some(chassis) = self.chassis() {
            self.set_identity(
                Identity {
                    chassis,
                    system_name,
                },
                now,
            );
        }
    }
}
