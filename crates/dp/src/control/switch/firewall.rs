//! The firewall's live control: the security groups as they run, changed under the control
//! lock, recorded before they are put in force; ports by zone for `ct list` and `ct stats`.

use qswitch_api::config::SecurityGroupConfig;
use qswitch_api::Config;

use super::{Switch, SwitchError};

/// Records the security groups a change leaves, before they are put in force; an error
/// (its message) refuses the change ([`SwitchError::NotRecorded`]).
pub type RecordGroups<'a> = dyn FnMut(&[SecurityGroupConfig]) -> Result<(), String> + 'a;

impl Switch {
    /// The security groups in force.
    pub fn security_groups(&self) -> Vec<SecurityGroupConfig> {
        self.control.lock().security_groups.clone()
    }

    /// Replaces the security groups: checked with the ports as they run (a group a port or
    /// a `remote_group` names must exist, names unique), recorded by `record`, then
    /// compiled and put in force; connections the new rules no longer allow are ended.
    /// A refused change changes nothing.
    pub fn set_security_groups_recorded(
        &self,
        groups: Vec<SecurityGroupConfig>,
        record: &mut RecordGroups<'_>,
    ) -> Result<(), SwitchError> {
        let mut ctl = self.control.lock();
        let table = self.shared.ports.load_full();
        let check = Config {
            ports: table
                .iter()
                .flatten()
                .map(|p| p.config.clone())
                .chain(ctl.waiting.iter().cloned())
                .collect(),
            security_groups: groups,
            ..Config::default()
        };
        check.check_security_groups()?;
        record(&check.security_groups).map_err(SwitchError::NotRecorded)?;
        ctl.security_groups = check.security_groups;
        self.compile_firewall(&ctl, &table);
        tracing::info!("security groups set");
        Ok(())
    }

    /// The zone (port id) of the port `name`.
    pub fn port_zone(&self, name: &str) -> Result<u32, SwitchError> {
        self.shared
            .ports
            .load()
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .map(|p| u32::from(p.id.0))
            .ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))
    }

    /// The name of the port in each zone (by port id; `None`: no port there).
    pub fn zone_names(&self) -> Vec<Option<String>> {
        let table = self.shared.ports.load();
        let mut names = Vec::new();
        for p in table.iter().flatten() {
            let i = usize::from(p.id.0);
            if names.len() <= i {
                names.resize(i + 1, None);
            }
            names[i] = Some(p.config.name.clone());
        }
        names
    }

    /// Frames each port's firewall allowed and denied, per direction, by zone (port id;
    /// `None`: no port there): the sums of the workers' per-port counters (rx queues for
    /// egress, tx slots for ingress).
    pub fn zone_traffic(&self) -> Vec<Option<ZoneTraffic>> {
        use crate::stats::DropReason;
        let table = self.shared.ports.load();
        let mut out = Vec::new();
        for p in table.iter().flatten() {
            let i = usize::from(p.id.0);
            if out.len() <= i {
                out.resize(i + 1, None);
            }
            let c = &p.counters;
            out[i] = Some(ZoneTraffic {
                allowed_egress: c.rx.iter().map(|q| q.fw_allowed.get()).sum(),
                denied_egress: (c.rx.iter())
                    .map(|q| q.drops.get(DropReason::FwDeniedEgress))
                    .sum(),
                allowed_ingress: c.tx.iter().map(|t| t.fw_allowed.get()).sum(),
                denied_ingress: (c.tx.iter())
                    .map(|t| t.drops.get(DropReason::FwDeniedIngress))
                    .sum(),
            });
        }
        out
    }
}

/// One port's firewall verdicts in frames ([`Switch::zone_traffic`]). Egress: from the
/// port's VM; ingress: toward it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZoneTraffic {
    pub allowed_ingress: u64,
    pub allowed_egress: u64,
    pub denied_ingress: u64,
    pub denied_egress: u64,
}
