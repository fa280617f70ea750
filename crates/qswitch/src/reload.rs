//! `qswitch reload` and SIGHUP: re-read the config file and apply only what changed in it.
//!
//! The file is parsed and validated first, then merged with what runs ([`crate::state::merge`]:
//! ports whose `[[port]]` table changed in the file take the file's version, the others keep
//! their live version) and the merge validated as a whole; any error there changes nothing.
//! Then, in this order: removed ports go, changed ports are removed and added again (a port
//! whose only change is its QoS gets a `qos set` instead and keeps running), new ports are
//! added, and the placement mode is set. Security groups changed in the file are put in
//! force around the port changes (new and changed ones before, removed ones after), and
//! end the connections their new rules no longer allow. Untouched ports are not touched at all: a change
//! publishes a new port table, and workers keep switching between the other ports across it.
//! `[switch]` keys other than `placement` take effect at the next restart.
//!
//! What runs is read from the switch ([`Persist::live`]) and what is recorded afterwards is
//! what runs then, so a reload that stops half-way records the steps it did.

use anyhow::{anyhow, Context};
use qswitch_api::config::SwitchConfig;
use qswitch_api::Config;
use qswitch_dp::Switch;

use crate::state::{merge, qos_update, same_but_live, Live, Persist, Pins};

/// Reloads; returns one line per change applied. Holds no lock of its own: the caller holds
/// the persistence mutex.
pub fn reload(p: &mut Persist, sw: &Switch) -> anyhow::Result<Vec<String>> {
    let path = p.config_path().to_path_buf();
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}; nothing changed", path.display()))?;
    let file = Config::from_toml(&text).map_err(|e| anyhow!("{e}; nothing changed"))?;
    let online = qswitch_sys::thread::online_cpus().context("cannot read the online CPUs")?;
    file.validate(&online)
        .map_err(|e| anyhow!("{e}; nothing changed"))?;
    // `[firewall]` sized the connection table at start: reload does not change it
    // (docs/firewall.md); never accept a file whose limits would not be in force. Groups
    // changed in the file are applied (below).
    if file.firewall != p.base().firewall {
        anyhow::bail!(
            "[firewall] changed: reload does not apply it (restart qswitch); nothing changed"
        );
    }
    let live = p.live(sw);
    let mut target = merge(p.base(), &live, &file);
    let mut changes = Vec::new();
    let restart = restart_keys(&live.config.switch, &file.switch);
    if !restart.is_empty() {
        changes.push(format!(
            "[switch] {} changed: takes effect at the next restart",
            restart.join(", ")
        ));
    }
    let mut keep = live.config.switch.clone();
    keep.placement = target.config.switch.placement;
    // Flow export: the file's tables where they changed (the daemon applies them after).
    keep.ipfix = target.config.switch.ipfix;
    keep.sflow = target.config.switch.sflow;
    target.config.switch = keep;
    target.config.validate(&online).map_err(|e| {
        anyhow!("the file with the live changes on top is invalid: {e}; nothing changed")
    })?;
    let mut pins = live.pins.clone();
    match apply(sw, &live, &target, &mut pins, &mut changes) {
        Ok(()) => {
            p.commit(sw, target.config.switch, target.pins, Some((file, text)))?;
            for c in &changes {
                tracing::info!("reload: {c}");
            }
            Ok(changes)
        }
        Err(e) => {
            // Record what did happen; the next reload retries the rest.
            let recorded = p.commit(sw, live.config.switch, pins, None);
            let done = if changes.is_empty() {
                "nothing".to_string()
            } else {
                changes.join("; ")
            };
            let mut msg = format!(
                "reload stopped: {}; applied before: {done}",
                crate::chain(&e)
            );
            if let Err(r) = recorded {
                msg.push_str(&format!("; and {}", crate::chain(&r)));
            }
            Err(anyhow!(msg))
        }
    }
}

/// Applies the differences between `live` and `target`, keeping `pins` (which start as
/// `live`'s) those of the ports still running as they were, also when a step fails.
fn apply(
    sw: &Switch,
    live: &Live,
    target: &Live,
    pins: &mut Pins,
    changes: &mut Vec<String>,
) -> anyhow::Result<()> {
    let find = |c: &Config, name: &str| c.ports.iter().position(|p| p.name == name);
    // Mirror sessions that go, change, or use a port that changes stop first (a port a
    // session uses cannot be removed); the target's start again at the end.
    let port = |c: &'_ Config, name: &str| find(c, name).map(|i| c.ports[i].clone());
    for m in &live.config.mirrors {
        let ports_same = (m.sources.iter().chain(&m.output))
            .all(|p| port(&live.config, p) == port(&target.config, p));
        if !(ports_same && target.config.mirrors.contains(m)) {
            sw.mirror_del(&m.name)?;
            if !target.config.mirrors.iter().any(|t| t.name == m.name) {
                changes.push(format!("mirror {}: removed", m.name));
            }
        }
    }
    // Security groups: first the new ones with the old ones kept, so that every port, old
    // or new, names groups that exist while the ports change; the old ones go at the end.
    let (old_groups, new_groups) = (&live.config.security_groups, &target.config.security_groups);
    let groups_change = old_groups != new_groups;
    if groups_change {
        let mut both = new_groups.clone();
        both.extend(
            (old_groups.iter())
                .filter(|g| !new_groups.iter().any(|n| n.name == g.name))
                .cloned(),
        );
        // Recorded by the caller once the reload is done.
        sw.set_security_groups_recorded(both, &mut |_| Ok(()))?;
    }
    // Removed and changed ports.
    for old in &live.config.ports {
        let name = old.name.as_str();
        match find(&target.config, name).map(|i| &target.config.ports[i]) {
            Some(new) if new == old => {}
            Some(new) if same_but_live(old, new) => {
                if new.security_groups != old.security_groups {
                    let update = qswitch_api::policy::PolicyUpdate {
                        security_groups: Some(new.security_groups.clone()),
                        ..Default::default()
                    };
                    sw.update_port_policy(name, &update)?;
                    changes.push(format!("port {name}: security groups set"));
                }
                if new.qos != old.qos {
                    sw.qos_set(name, &qos_update(new.qos_settings()))?;
                    changes.push(format!("port {name}: qos set"));
                }
            }
            Some(new) => {
                sw.del_port(name)?;
                pins.retain(|(p, _), _| p != name);
                sw.add_port(new)?;
                changes.push(format!("port {name}: changed, removed and added again"));
            }
            None => {
                sw.del_port(name)?;
                pins.retain(|(p, _), _| p != name);
                changes.push(format!("port {name}: removed"));
            }
        }
    }
    for new in &target.config.ports {
        if find(&live.config, &new.name).is_none() {
            sw.add_port(new)?;
            changes.push(format!("port {}: added", new.name));
        }
    }
    let running = sw.mirror_configs();
    for m in &target.config.mirrors {
        if !running.iter().any(|r| r.name == m.name) {
            sw.mirror_add(m)?;
            let was = live.config.mirrors.iter().find(|l| l.name == m.name);
            changes.push(match was {
                Some(w) if w == m => {
                    format!("mirror {}: restarted (a port it uses changed)", m.name)
                }
                Some(_) => format!("mirror {}: changed", m.name),
                None => format!("mirror {}: added", m.name),
            });
        }
    }
    if groups_change {
        sw.set_security_groups_recorded(new_groups.clone(), &mut |_| Ok(()))?;
        for g in old_groups {
            match new_groups.iter().find(|n| n.name == g.name) {
                Some(n) if n == g => {}
                Some(_) => changes.push(format!("security group {}: changed", g.name)),
                None => changes.push(format!("security group {}: removed", g.name)),
            }
        }
        for n in new_groups {
            if !old_groups.iter().any(|g| g.name == n.name) {
                changes.push(format!("security group {}: added", n.name));
            }
        }
    }
    let mode = target.config.switch.placement;
    if mode != live.config.switch.placement {
        sw.set_placement_mode(mode);
        changes.push(format!("placement mode {mode}"));
    }
    Ok(())
}

/// The `[switch]` keys other than `placement` that differ.
fn restart_keys(a: &SwitchConfig, b: &SwitchConfig) -> Vec<&'static str> {
    let mut keys = Vec::new();
    let mut check = |same: bool, key: &'static str| {
        if !same {
            keys.push(key);
        }
    };
    check(a.workers == b.workers, "workers");
    check(a.control == b.control, "control");
    check(a.fdb_aging == b.fdb_aging, "fdb_aging");
    check(a.poll_spin_us == b.poll_spin_us, "poll_spin_us");
    check(a.reserved_cpus == b.reserved_cpus, "reserved_cpus");
    check(a.reservable == b.reservable, "reservable");
    check(a.http == b.http, "http");
    check(a.state_dir == b.state_dir, "state_dir");
    check(a.control_group == b.control_group, "control_group");
    check(a.admin_group == b.admin_group, "admin_group");
    check(a.socket_dirs == b.socket_dirs, "socket_dirs");
    keys
}

/// `qswitch reload`: asks the daemon to reload and prints what changed.
pub fn cli(control: &std::path::Path) -> anyhow::Result<()> {
    match qswitch_api::client::call(control, &qswitch_api::Request::Reload)? {
        qswitch_api::Response::Reloaded { changes } if changes.is_empty() => {
            println!("nothing changed");
        }
        qswitch_api::Response::Reloaded { changes } => {
            for c in changes {
                println!("{c}");
            }
        }
        _ => anyhow::bail!("unexpected reply"),
    }
    Ok(())
}
