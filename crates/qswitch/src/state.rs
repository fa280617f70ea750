//! Live changes that survive a restart: the state file and the one place changes go through.
//!
//! # The state file
//! `<state_dir>/state.json` holds the *effective* configuration (the file plus every live
//! change, as the TOML `config dump` prints), the placement pins (which the config file has
//! no key for), the text of the config file it was last reconciled with (`base`), the file's
//! path and a generation number. It is always written whole: a temporary file in the same
//! directory, `fsync`, `rename` over `state.json`, `fsync` of the directory. A crash at any
//! moment leaves the old file or the new one, never a mix.
//!
//! Why the whole effective configuration and not a change log: it is small (a few KB per
//! hundred ports), reading it back is the config parser every file already goes through
//! (with its validation), and there is no log to replay, compact, or get half-written.
//!
//! # One copy of a port's settings
//! The switch's port table is the truth: [`qswitch_dp::Switch::port_configs`] puts each
//! port's configuration together from what runs (the keys it was added with, its live policy
//! and QoS). What is recorded and what `config dump` prints are derived from it; [`Persist`]
//! keeps no port settings of its own, only the `[switch]` table, the pins and, as a cache of
//! what the file holds, each port's rendered TOML.
//!
//! # Ordering
//! Every change (port add/del, port set, qos set, placement pin and mode, reload) runs under
//! one mutex, [`Persist`]'s, and is recorded before it is acknowledged. A port change is
//! checked by the switch, recorded with the port configurations it will leave
//! ([`qswitch_dp::Record`]), and only then published; a change whose record cannot be written
//! is refused and nothing changes (nothing to undo). Two concurrent changes are therefore
//! recorded in the order they were applied, an acknowledged change is on disk, and after a
//! crash between record and publish the restart applies the recorded change (which had
//! passed every check). A placement pin is applied first and undone if its record fails.
//!
//! # The config file and the live state
//! The file declares ports; live changes override it. At start and on reload the three
//! versions are merged per port ([`merge`]): a port whose `[[port]]` table is the same as when
//! the state was last recorded keeps its live version (or its live removal); a port whose table
//! changed in the file takes the file's version (added, changed or removed); the same for
//! `[switch] placement`. Pins survive on ports that stay unchanged. Other `[switch]` keys come
//! from the file at start and need a restart to change.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use qswitch_api::config::{PortConfig, SecurityGroupConfig, SwitchConfig};
use qswitch_api::{Config, Request, Response};
use qswitch_dp::Switch;
use serde::{Deserialize, Serialize};

/// The state file's name inside the state directory.
pub const STATE_FILE: &str = "state.json";
const VERSION: u32 = 1;

/// Placement pins: (port, queue) -> CPU.
pub type Pins = BTreeMap<(String, u16), usize>;

/// A whole state: an effective configuration and the pins. What runs is one
/// ([`Persist::live`], derived from the switch); so are the recorded state and the result of
/// a merge.
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub config: Config,
    pub pins: Pins,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    version: u32,
    generation: u64,
    /// The config file this state belongs to (canonical path).
    config_path: String,
    /// The config file's text when the state was last reconciled with it.
    base: String,
    /// The effective configuration as TOML.
    effective: String,
    pins: Vec<Pin>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pin {
    port: String,
    queue: u16,
    cpu: usize,
}

/// The daemon's record of what runs, and where it is kept.
pub struct Persist {
    /// `None`: persistence is off (the default directory could not be used).
    dir: Option<PathBuf>,
    config_path: PathBuf,
    base: Config,
    base_text: String,
    /// The `[switch]` table as it runs (the file's, with the live placement mode).
    switch: SwitchConfig,
    /// The security groups as recorded (the switch's, [`Switch::security_groups`]).
    groups: Vec<SecurityGroupConfig>,
    pins: Pins,
    generation: u64,
    /// The ports as the state file holds them, each with its `"\n" + [[port]] TOML`
    /// escaped for a JSON string: a cache of the file, so that a change re-renders only the
    /// ports it touched (see [`Persist::state_bytes`]); empty until the first record.
    rendered: Vec<Rendered>,
    /// `base_text` escaped for a JSON string.
    base_escaped: String,
    /// The mirror sessions as recorded (what runs once a change is committed).
    mirrors: Vec<qswitch_api::config::MirrorConfig>,
}

/// A port as the state file holds it, and its `"\n" + [[port]] TOML` escaped for a JSON
/// string.
type Rendered = (PortConfig, String);

/// What start-up found: the configuration to start with, its pins, and the record.
pub struct Start {
    pub persist: Persist,
    /// What to start: the file merged with the recorded state.
    pub live: Live,
    /// Lines for the log: where the state came from, pins dropped, ...
    pub notes: Vec<String>,
}

/// Refuses a state directory that anyone but root and this daemon's user could write to
/// (group- or world-writable, or owned by another user): a state file planted there would be
/// applied at the next start, ports and all (audit finding F10).
fn check_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(dir)
        .with_context(|| format!("cannot read the state directory {}", dir.display()))?;
    if !md.is_dir() {
        bail!("state directory {} is not a directory", dir.display());
    }
    let me = qswitch_sys::thread::euid();
    if md.uid() != 0 && md.uid() != me {
        bail!(
            "state directory {} is owned by uid {}, not root or this daemon's user (uid {me}): \
             refusing state that user could plant (chown it, or set [switch] state_dir)",
            dir.display(),
            md.uid()
        );
    }
    if md.mode() & 0o022 != 0 {
        bail!(
            "state directory {} is writable by {} (mode {:o}): refusing state others could \
             plant (chmod go-w {})",
            dir.display(),
            if md.mode() & 0o002 != 0 {
                "everyone"
            } else {
                "its group"
            },
            md.mode() & 0o7777,
            dir.display()
        );
    }
    Ok(())
}

/// Whether a request changes the switch (and so goes through [`Persist`]).
pub fn is_change(req: &Request) -> bool {
    matches!(
        req,
        Request::PortAdd { .. }
            | Request::PortDel { .. }
            | Request::QosSet { .. }
            | Request::PlacementPin { .. }
            | Request::PlacementMode { .. }
            | Request::MirrorAdd { .. }
            | Request::MirrorDel { .. }
            | Request::ExportSet { .. }
            | Request::ExportOff { .. }
            | Request::Reload
    )
}

/// The state directory: `[switch] state_dir`, else systemd's `$STATE_DIRECTORY`, else
/// [`qswitch_api::config::DEFAULT_STATE_DIR`]. The flag says whether it was asked for
/// explicitly (then an unusable directory is an error, not a warning).
pub fn state_dir(config: &Config) -> (PathBuf, bool) {
    if let Some(d) = &config.switch.state_dir {
        return (d.clone(), true);
    }
    if let Some(d) = std::env::var_os("STATE_DIRECTORY").filter(|d| !d.is_empty()) {
        // systemd may pass several, colon-separated; the first is ours.
        let first = d
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or("")
            .to_string();
        return (PathBuf::from(first), true);
    }
    (PathBuf::from(qswitch_api::config::DEFAULT_STATE_DIR), false)
}

impl Persist {
    /// Reads the state (if any) for the config file at `path` (already parsed as `file`,
    /// from `text`) and merges it with the file. Does not write anything yet.
    pub fn open(path: &Path, text: &str, file: &Config) -> anyhow::Result<Start> {
        let config_path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let (dir, explicit) = state_dir(file);
        let mut notes = Vec::new();
        let dir = match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&dir)
        {
            Ok(()) => Some(dir),
            Err(e) if !explicit => {
                tracing::warn!(
                    dir = %dir.display(),
                    error = %e,
                    "cannot use the default state directory: live changes will not survive a restart (set [switch] state_dir)"
                );
                None
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("cannot create the state directory {}", dir.display())
                })
            }
        };
        if let Some(d) = &dir {
            check_dir(d)?;
        }
        let fresh = Live {
            config: file.clone(),
            pins: BTreeMap::new(),
        };
        let mut persist = Persist {
            dir,
            config_path,
            base: file.clone(),
            base_text: text.to_string(),
            switch: file.switch.clone(),
            groups: file.security_groups.clone(),
            pins: Pins::new(),
            generation: 0,
            rendered: Vec::new(),
            mirrors: file.mirrors.clone(),
            base_escaped: {
                let quoted = serde_json::to_string(text)?;
                quoted[1..quoted.len() - 1].to_string()
            },
        };
        let Some(dir) = persist.dir.clone() else {
            return Ok(Start {
                persist,
                live: fresh,
                notes,
            });
        };
        let state_path = dir.join(STATE_FILE);
        let read = |p: &Path| -> std::io::Result<Vec<u8>> {
            let mut raw = Vec::new();
            std::io::Read::read_to_end(&mut qswitch_sys::fd::open_regular(p)?, &mut raw)?;
            Ok(raw)
        };
        let raw = match read(&state_path) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                notes.push(format!(
                    "no state in {}: starting from the file",
                    dir.display()
                ));
                return Ok(Start {
                    persist,
                    live: fresh,
                    notes,
                });
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", state_path.display()))
            }
        };
        let bad = || {
            format!(
                "state file {} is unreadable (remove it to start from the config file alone)",
                state_path.display()
            )
        };
        let state: StateFile = serde_json::from_slice(&raw).with_context(bad)?;
        if state.version != VERSION {
            bail!("{}: version {} (expected {VERSION})", bad(), state.version);
        }
        if Path::new(&state.config_path) != persist.config_path {
            if !explicit {
                // The default directory is shared by every daemon that sets none: do not
                // take over or overwrite another configuration's state.
                tracing::warn!(
                    "state in {} belongs to {}: live changes of this daemon ({}) will not \
                     survive a restart (set [switch] state_dir)",
                    dir.display(),
                    state.config_path,
                    persist.config_path.display()
                );
                persist.dir = None;
                return Ok(Start {
                    persist,
                    live: fresh,
                    notes,
                });
            }
            // A state directory of its own identifies the daemon: the config file moved.
            notes.push(format!(
                "state in {} was recorded for {}; the config file is now {}",
                dir.display(),
                state.config_path,
                persist.config_path.display()
            ));
        }
        let base = Config::from_toml(&state.base).with_context(bad)?;
        let effective = Config::from_toml(&state.effective).with_context(bad)?;
        let recorded = Live {
            config: effective,
            pins: state
                .pins
                .into_iter()
                .map(|p| ((p.port, p.queue), p.cpu))
                .collect(),
        };
        let merged = merge(&base, &recorded, file);
        let changed_in_file = base != *file;
        notes.push(format!(
            "state generation {} from {}{}",
            state.generation,
            state_path.display(),
            if changed_in_file {
                " (the config file changed since: its changes applied on top)"
            } else {
                ""
            }
        ));
        persist.switch = merged.config.switch.clone();
        persist.groups = merged.config.security_groups.clone();
        persist.pins = merged.pins.clone();
        persist.mirrors = merged.config.mirrors.clone();
        persist.generation = state.generation;
        Ok(Start {
            persist,
            live: merged,
            notes,
        })
    }

    /// What runs: the switch's ports ([`Switch::port_configs`]), the `[switch]` table and
    /// the pins.
    pub fn live(&self, sw: &Switch) -> Live {
        Live {
            config: Config {
                switch: self.switch.clone(),
                ports: sw.port_configs(),
                // `[firewall]` has no live changes: the file's.
                firewall: self.base.firewall,
                security_groups: sw.security_groups(),
                mirrors: sw.mirror_configs(),
            },
            pins: self.pins.clone(),
        }
    }

    /// `config dump`: the effective configuration (what runs), and the pins as comments.
    pub fn dump(&self, sw: &Switch) -> anyhow::Result<String> {
        let live = self.live(sw);
        let mut s = live.config.to_toml().context("cannot write TOML")?;
        if !live.pins.is_empty() {
            s.push_str(
                "\n# Placement pins (live state only; `qswitch placement pin` sets them):\n",
            );
            for ((port, queue), cpu) in &live.pins {
                s.push_str(&format!("#   {port} queue {queue} -> CPU {cpu}\n"));
            }
        }
        Ok(s)
    }

    /// The state file's bytes for `ports`, `switch` and `pins` (generation `generation`,
    /// file text `base_escaped`) and the port fragments to keep for the next call.
    ///
    /// The file is JSON whose `effective` string is the TOML of [`Config::to_toml`]. It is
    /// assembled from pieces kept between changes: each port's `[[port]]` TOML, already
    /// escaped as JSON, in [`Persist::rendered`], and the escaped file text. A change
    /// re-renders only the ports it touched: rendering and escaping a thousand unchanged
    /// ports made every `port add` at that scale several times slower than at ten. JSON
    /// escaping works per character, so the escaped pieces concatenated are the escaped
    /// whole; the file reads back with [`StateFile`].
    fn state_bytes(
        &self,
        ports: &[PortConfig],
        switch: &SwitchConfig,
        pins: &Pins,
        generation: u64,
        base_escaped: &str,
    ) -> anyhow::Result<(Vec<u8>, Vec<Rendered>)> {
        let escape = |text: &str| -> anyhow::Result<String> {
            let quoted = serde_json::to_string(text)?;
            Ok(quoted[1..quoted.len() - 1].to_string())
        };
        let old: HashMap<&str, &Rendered> = (self.rendered.iter())
            .map(|r| (r.0.name.as_str(), r))
            .collect();
        let mut rendered = Vec::with_capacity(ports.len());
        for p in ports {
            let text = match old.get(p.name.as_str()).filter(|(c, _)| c == p) {
                Some((_, text)) => text.clone(),
                None => {
                    let toml = qswitch_api::config::port_toml(p).context("cannot write TOML")?;
                    escape(&format!("\n{toml}"))?
                }
            };
            rendered.push((p.clone(), text));
        }
        let config = Config {
            switch: switch.clone(),
            mirrors: self.mirrors.clone(),
            firewall: self.base.firewall,
            security_groups: self.groups.clone(),
            ..Config::default()
        };
        let switch = escape(&config.switch_toml().context("cannot write TOML")?)?;
        let pins: Vec<Pin> = (pins.iter())
            .map(|((port, queue), cpu)| Pin {
                port: port.clone(),
                queue: *queue,
                cpu: *cpu,
            })
            .collect();
        let size =
            base_escaped.len() + switch.len() + rendered.iter().map(|r| r.1.len()).sum::<usize>();
        let mut out = Vec::with_capacity(size + 512);
        write!(
            out,
            "{{\n  \"version\": {VERSION},\n  \"generation\": {generation},\n  \"config_path\": {},\n  \"base\": \"{base_escaped}\",\n  \"effective\": \"{switch}",
            serde_json::to_string(&self.config_path.display().to_string())?,
        )?;
        for (_, text) in &rendered {
            out.extend_from_slice(text.as_bytes());
        }
        write!(
            out,
            "\",\n  \"pins\": {}\n}}\n",
            serde_json::to_string(&pins)?
        )?;
        Ok((out, rendered))
    }

    /// Records `ports`, `switch` and `pins` (and `base` as the file's text, when given) as
    /// the state; durable before it returns. The caller keeps `switch` and `pins` as what
    /// runs only once this succeeds.
    fn write(
        &mut self,
        ports: &[PortConfig],
        switch: &SwitchConfig,
        pins: &Pins,
        base: Option<(Config, String)>,
    ) -> anyhow::Result<()> {
        let mut rendered = Vec::new();
        let mut base_escaped = None;
        if let Some(dir) = &self.dir {
            if let Some((_, text)) = &base {
                let quoted = serde_json::to_string(text)?;
                base_escaped = Some(quoted[1..quoted.len() - 1].to_string());
            }
            let escaped = base_escaped.as_deref().unwrap_or(&self.base_escaped);
            let (bytes, r) = self.state_bytes(ports, switch, pins, self.generation + 1, escaped)?;
            rendered = r;
            write_atomic(dir, STATE_FILE, &bytes)
                .with_context(|| format!("cannot record the state in {}", dir.display()))?;
        }
        if let Some((c, t)) = base {
            self.base = c;
            self.base_text = t;
        }
        if let Some(e) = base_escaped {
            self.base_escaped = e;
        }
        self.rendered = rendered;
        self.generation += 1;
        Ok(())
    }

    /// Records what runs: the switch's ports, with `switch` and `pins` (which become this
    /// record's), and `base` as the file's text when given. Durable before it returns.
    /// Records flow export as set live (`qswitch export`): the state file's `[switch]`
    /// gets the tables, and a restart or reload keeps them while the file's do not change.
    pub fn commit_export(
        &mut self,
        sw: &Switch,
        ipfix: Option<qswitch_api::config::IpfixConfig>,
        sflow: Option<qswitch_api::config::SflowConfig>,
    ) -> anyhow::Result<()> {
        let mut switch = self.switch.clone();
        switch.ipfix = ipfix;
        switch.sflow = sflow;
        self.commit(sw, switch, self.pins.clone(), None)
    }

    /// The `[switch]` table as it runs (the file's, with the live changes on top).
    pub fn switch_config(&self) -> &SwitchConfig {
        &self.switch
    }

    pub fn commit(
        &mut self,
        sw: &Switch,
        switch: SwitchConfig,
        pins: Pins,
        base: Option<(Config, String)>,
    ) -> anyhow::Result<()> {
        let mirrors = std::mem::replace(&mut self.mirrors, sw.mirror_configs());
        let groups = std::mem::replace(&mut self.groups, sw.security_groups());
        if let Err(e) = self.write(&sw.port_configs(), &switch, &pins, base) {
            self.mirrors = mirrors;
            self.groups = groups;
            return Err(e);
        }
        self.switch = switch;
        self.pins = pins;
        Ok(())
    }

    /// Applies one change request to the switch, recorded before it is published (see the
    /// module docs); a change that cannot be recorded is refused whole. Called with the
    /// daemon's persistence mutex held.
    pub fn change(&mut self, sw: &Switch, req: Request) -> anyhow::Result<Response> {
        let switch = self.switch.clone();
        let mut pins = self.pins.clone();
        match req {
            Request::PortAdd { port } => {
                sw.add_port_recorded(&port, &mut self.recorder(&switch, &pins))?;
            }
            Request::PortDel { name } => {
                pins.retain(|(p, _), _| *p != name);
                sw.del_port_recorded(&name, &mut self.recorder(&switch, &pins))?;
            }
            Request::QosSet {
                port,
                min,
                max,
                weight,
                clear,
            } => {
                let update = qswitch_dp::qos::QosUpdate {
                    min,
                    max,
                    weight,
                    clear,
                };
                sw.qos_set_recorded(&port, &update, &mut self.recorder(&switch, &pins))?;
            }
            Request::PortSet { name, update } => {
                let mut record = self.recorder(&switch, &pins);
                sw.update_port_policy_recorded(&name, &update, &mut record)?;
            }
            Request::PlacementPin { port, queue, cpu } => {
                // Pins are placement, not port settings: applied, then recorded (and undone
                // if the record fails).
                let key = (port.clone(), queue);
                let old = pins.get(&key).copied();
                sw.pin(&port, queue, cpu)?;
                match cpu {
                    Some(c) => pins.insert(key, c),
                    None => pins.remove(&key),
                };
                self.commit(sw, switch, pins, None).inspect_err(|_| {
                    let _ = sw.pin(&port, queue, old);
                })?;
                return Ok(Response::Ok);
            }
            Request::PlacementMode { mode } => {
                // Setting the mode cannot fail: recorded first, then set.
                let mut switch = switch;
                switch.placement = mode;
                self.commit(sw, switch, pins, None)?;
                sw.set_placement_mode(mode);
                return Ok(Response::Ok);
            }
            Request::MirrorAdd { mirror } => {
                // Applied, then recorded (and removed again if the record fails).
                sw.mirror_add(&mirror)?;
                self.commit(sw, switch, pins, None).inspect_err(|_| {
                    let _ = sw.mirror_del(&mirror.name);
                })?;
                return Ok(Response::Ok);
            }
            Request::MirrorDel { name } => {
                let Some(old) = sw.mirror_configs().into_iter().find(|m| m.name == name) else {
                    bail!("mirror '{name}' does not exist");
                };
                sw.mirror_del(&name)?;
                self.commit(sw, switch, pins, None).inspect_err(|_| {
                    let _ = sw.mirror_add(&old);
                })?;
                return Ok(Response::Ok);
            }
            Request::Reload => {
                let changes = crate::reload::reload(self, sw)?;
                return Ok(Response::Reloaded { changes });
            }
            Request::SgAdd { .. }
            | Request::SgDel { .. }
            | Request::SgRuleAdd { .. }
            | Request::SgRuleDel { .. }
            | Request::SgAddresses { .. } => {
                let groups = group_change(sw.security_groups(), &sw.port_configs(), req)?;
                self.set_groups(sw, groups, &switch, &pins)?;
            }
            other => bail!("not a change: {other:?}"),
        }
        self.pins = pins;
        Ok(Response::Ok)
    }

    /// Puts `groups` in force, recorded first with the ports as they run, `switch` and
    /// `pins` (see [`Switch::set_security_groups_recorded`]).
    pub fn set_groups(
        &mut self,
        sw: &Switch,
        groups: Vec<SecurityGroupConfig>,
        switch: &SwitchConfig,
        pins: &Pins,
    ) -> anyhow::Result<()> {
        // Read before: the record runs under the switch's control lock.
        let ports = sw.port_configs();
        sw.set_security_groups_recorded(groups, &mut |g| {
            let old = std::mem::replace(&mut self.groups, g.to_vec());
            self.write(&ports, switch, pins, None).map_err(|e| {
                self.groups = old;
                crate::chain(&e)
            })
        })?;
        Ok(())
    }

    /// A [`qswitch_dp::Record`] that writes the state file with the ports it is given, and
    /// `switch` and `pins`.
    fn recorder<'a>(
        &'a mut self,
        switch: &'a SwitchConfig,
        pins: &'a Pins,
    ) -> impl FnMut(&[PortConfig]) -> Result<(), String> + 'a {
        move |ports| {
            self.write(ports, switch, pins, None)
                .map_err(|e| crate::chain(&e))
        }
    }

    /// The config file's path.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The file as last reconciled.
    pub fn base(&self) -> &Config {
        &self.base
    }
}

/// The security groups after an `sg` change request, or why it makes no sense (one line).
/// The whole (groups and `ports`) is checked again by the switch.
pub fn group_change(
    mut groups: Vec<SecurityGroupConfig>,
    ports: &[PortConfig],
    req: Request,
) -> anyhow::Result<Vec<SecurityGroupConfig>> {
    fn find<'a>(
        groups: &'a mut [SecurityGroupConfig],
        name: &str,
    ) -> anyhow::Result<&'a mut SecurityGroupConfig> {
        groups
            .iter_mut()
            .find(|g| g.name == name)
            .ok_or_else(|| anyhow::anyhow!("security group '{name}' does not exist"))
    }
    match req {
        Request::SgAdd { group } => {
            if groups.iter().any(|g| g.name == group.name) {
                bail!("security group '{}' already exists", group.name);
            }
            groups.push(group);
        }
        Request::SgDel { name } => {
            find(&mut groups, &name)?;
            if let Some(p) = ports.iter().find(|p| p.security_groups.contains(&name)) {
                bail!("security group '{name}' is used by port '{}'", p.name);
            }
            for g in groups.iter().filter(|g| g.name != name) {
                let remote = |r: &qswitch_api::config::GroupRule| matches!(&r.remote, Some(qswitch_api::config::RuleRemote::Group(n)) if *n == name);
                if let Some(i) = g.rules.iter().position(remote) {
                    bail!(
                        "security group '{name}' is named by rule {i} of group '{}' (remote_group)",
                        g.name
                    );
                }
            }
            groups.retain(|g| g.name != name);
        }
        Request::SgRuleAdd { group, rule } => find(&mut groups, &group)?.rules.push(rule),
        Request::SgRuleDel { group, index } => {
            let g = find(&mut groups, &group)?;
            if index >= g.rules.len() {
                bail!(
                    "security group '{group}' has no rule {index} (it has {})",
                    g.rules.len()
                );
            }
            g.rules.remove(index);
        }
        Request::SgAddresses { group, addresses } => {
            find(&mut groups, &group)?.addresses = addresses;
        }
        other => bail!("not a security-group change: {other:?}"),
    }
    Ok(groups)
}

/// An update that sets exactly `s`.
pub fn qos_update(s: qswitch_api::QosSettings) -> qswitch_dp::qos::QosUpdate {
    qswitch_dp::qos::QosUpdate {
        min: s.min,
        max: s.max,
        weight: Some(s.weight),
        clear: true,
    }
}

/// Three-way merge of the file as last reconciled (`base`), what runs (`live`) and the file
/// now (`file`): per port, unchanged in the file keeps the live version (or its live
/// absence); changed in the file takes the file's. The same for `placement`; the other
/// `[switch]` keys come from `file`. Pins stay on ports whose configuration stays.
pub fn merge(base: &Config, live: &Live, file: &Config) -> Live {
    fn find<'a>(c: &'a Config, name: &str) -> Option<&'a PortConfig> {
        c.ports.iter().find(|p| p.name == name)
    }
    let mut ports: Vec<PortConfig> = Vec::new();
    for p in &live.config.ports {
        let (b, f) = (find(base, &p.name), find(file, &p.name));
        if b == f {
            ports.push(p.clone());
        } else if let Some(f) = f {
            ports.push(f.clone());
        }
    }
    for f in &file.ports {
        if !ports.iter().any(|p| p.name == f.name) && find(base, &f.name) != Some(f) {
            ports.push(f.clone());
        }
    }
    let mut switch = file.switch.clone();
    if file.switch.placement == base.switch.placement {
        switch.placement = live.config.switch.placement;
    }
    // Flow export set live (`qswitch export`) stays unless the file's table changed.
    if file.switch.ipfix == base.switch.ipfix {
        switch.ipfix = live.config.switch.ipfix;
    }
    if file.switch.sflow == base.switch.sflow {
        switch.sflow = live.config.switch.sflow;
    }
    // Groups as ports: unchanged in the file keeps the live version (or its live absence),
    // changed takes the file's.
    let group = |c: &Config, name: &str| c.security_groups.iter().find(|g| g.name == name).cloned();
    let mut security_groups = Vec::new();
    for g in &live.config.security_groups {
        let (b, f) = (group(base, &g.name), group(file, &g.name));
        if b == f {
            security_groups.push(g.clone());
        } else if let Some(f) = f {
            security_groups.push(f);
        }
    }
    for f in &file.security_groups {
        let new = !security_groups.iter().any(|g| g.name == f.name);
        if new && group(base, &f.name).as_ref() != Some(f) {
            security_groups.push(f.clone());
        }
    }
    let config = Config {
        switch,
        ports,
        // `[firewall]` has no live changes: the file's.
        firewall: file.firewall,
        security_groups,
        // Mirror sessions: the live ones while the file's stay as they were, else the file's.
        mirrors: if file.mirrors == base.mirrors {
            live.config.mirrors.clone()
        } else {
            file.mirrors.clone()
        },
    };
    let pins = live
        .pins
        .iter()
        .filter(
            |((port, _), _)| match (find(&config, port), find(&live.config, port)) {
                (Some(a), Some(b)) => same_but_live(a, b),
                _ => false,
            },
        )
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    Live { config, pins }
}

/// Whether two port configurations differ at most in what reload changes live on a
/// running port: its QoS settings and its security groups.
pub fn same_but_live(a: &PortConfig, b: &PortConfig) -> bool {
    let (mut a, mut b) = (a.clone(), b.clone());
    a.qos = None;
    b.qos = None;
    a.security_groups.clear();
    b.security_groups.clear();
    a == b
}

/// Writes `dir/name` so that a crash leaves either the old or the new content: a temporary
/// file in `dir`, fsync, rename, fsync of `dir`.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, dir.join(name))?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_toml(text).unwrap()
    }

    const A: &str = "[[port]]\nname = \"a\"\ntype = \"gen\"\n";
    const B: &str = "[[port]]\nname = \"b\"\ntype = \"gen\"\n";
    const B2: &str = "[[port]]\nname = \"b\"\ntype = \"gen\"\nqueues = 2\n";
    const C: &str = "[[port]]\nname = \"c\"\ntype = \"gen\"\n";

    fn names(l: &Live) -> Vec<&str> {
        l.config.ports.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn groups_merge_by_name_and_changes_are_checked() {
        let g = |name: &str, rules: &str| {
            format!("[[security_group]]\nname = \"{name}\"\nrules = [{rules}]\n")
        };
        let e = r#"{ direction = "egress" }"#;
        let i = r#"{ direction = "ingress" }"#;
        let base = cfg(&format!("{}{}{A}", g("x", e), g("y", e)));
        // Live: x got a rule, y removed, z added.
        let mut live = Live {
            config: base.clone(),
            pins: Pins::new(),
        };
        live.config.security_groups =
            cfg(&format!("{}{}", g("x", &format!("{e},{i}")), g("z", e))).security_groups;
        // The file left x and y alone: the live versions stay.
        let m = merge(&base, &live, &base);
        let names: Vec<&str> = m
            .config
            .security_groups
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        assert_eq!(names, ["x", "z"]);
        assert_eq!(m.config.security_groups[0].rules.len(), 2);
        // The file changed x and added w: its versions win for them.
        let file = cfg(&format!("{}{}{}{A}", g("x", i), g("y", e), g("w", e)));
        let m = merge(&base, &live, &file);
        let names: Vec<&str> = m
            .config
            .security_groups
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        assert_eq!(names, ["x", "z", "w"]);
        assert_eq!(m.config.security_groups[0], file.security_groups[0]);

        // Changes, and the one-line refusals.
        let mut ports = base.ports.clone();
        ports[0].security_groups = vec!["x".into()];
        let groups = base.security_groups.clone();
        let change =
            |req: Request| group_change(groups.clone(), &ports, req).map_err(|e| e.to_string());
        let rule: qswitch_api::config::GroupRule =
            serde_json::from_str(r#"{"direction":"ingress","remote_group":"y"}"#).unwrap();
        let after = change(Request::SgRuleAdd {
            group: "x".into(),
            rule: rule.clone(),
        })
        .unwrap();
        assert_eq!(after[0].rules.len(), 2);
        let e = |r| change(r).unwrap_err();
        assert!(e(Request::SgDel { name: "x".into() }).contains("used by port 'a'"));
        assert!(e(Request::SgRuleDel {
            group: "y".into(),
            index: 1
        })
        .contains("has no rule 1"));
        assert!(e(Request::SgRuleAdd {
            group: "q".into(),
            rule
        })
        .contains("'q' does not exist"));
        let dup = base.security_groups[1].clone();
        assert!(e(Request::SgAdd { group: dup }).contains("already exists"));
        let after = change(Request::SgAddresses {
            group: "y".into(),
            addresses: vec!["10.0.0.7".parse().unwrap()],
        })
        .unwrap();
        assert_eq!(after[1].addresses.len(), 1);
        assert_eq!(
            change(Request::SgDel { name: "y".into() }).unwrap().len(),
            1
        );
    }

    #[test]
    fn live_changes_survive_an_unchanged_file() {
        let base = cfg(&format!("{A}{B}"));
        // Live: b removed, c added, a pinned.
        let mut live = Live {
            config: cfg(&format!("{A}{C}")),
            pins: BTreeMap::new(),
        };
        live.pins.insert(("a".into(), 0), 1);
        let m = merge(&base, &live, &base);
        assert_eq!(m, live);
    }

    #[test]
    fn file_changes_win_for_the_ports_they_touch() {
        let base = cfg(&format!("{A}{B}"));
        let mut live = Live {
            config: cfg(&format!("{A}{B}{C}")),
            pins: BTreeMap::new(),
        };
        live.pins.insert(("a".into(), 0), 1);
        live.pins.insert(("b".into(), 0), 1);
        // The file changes b, removes a.
        let m = merge(&base, &live, &cfg(B2));
        assert_eq!(names(&m), ["b", "c"]);
        assert_eq!(m.config.ports[0].queues, 2);
        assert!(m.pins.is_empty());
        // The file adds c too: c was added live the same; nothing moves.
        let m = merge(&base, &live, &cfg(&format!("{A}{B}{C}")));
        assert_eq!(names(&m), ["a", "b", "c"]);
    }

    /// The state file assembled from kept pieces reads back as the state, through a series
    /// of changes (ports added, changed, removed, pinned, a new file text with quotes and
    /// non-ASCII in it).
    #[test]
    fn state_file_from_kept_pieces_reads_back() {
        let dir = std::env::temp_dir().join(format!("qs-state-kept-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("c.toml");
        std::fs::create_dir_all(&dir).unwrap();
        let text = format!(
            "[switch]\nstate_dir = \"{}\"\n{A}{B}",
            dir.join("state").display()
        );
        std::fs::write(&path, &text).unwrap();
        let file = cfg(&text);
        let mut persist = Persist::open(&path, &text, &file).unwrap().persist;
        let read_back = |p: &Persist| -> (StateFile, Config) {
            let raw = std::fs::read(p.dir.as_ref().unwrap().join(STATE_FILE)).unwrap();
            let state: StateFile = serde_json::from_slice(&raw).unwrap();
            let effective = Config::from_toml(&state.effective).unwrap();
            (state, effective)
        };
        type Step = Box<dyn Fn(&mut Live)>;
        let steps: Vec<Step> = vec![
            Box::new(|_| {}),
            Box::new(|l| l.config.ports.push(cfg(C).ports.remove(0))),
            Box::new(|l| l.config.ports[1] = cfg(B2).ports.remove(0)),
            Box::new(|l| {
                l.config.ports.remove(0);
            }),
            Box::new(|l| {
                l.pins.insert(("c".into(), 0), 1);
            }),
        ];
        let mut live = Live {
            config: file.clone(),
            pins: Pins::new(),
        };
        for (i, step) in steps.iter().enumerate() {
            step(&mut live);
            let base = (i == 3).then(|| {
                let t = format!("# \"Größe\"\\ {i}\n{text}");
                (cfg(&t), t)
            });
            (persist.write(
                &live.config.ports,
                &live.config.switch,
                &live.pins,
                base.clone(),
            ))
            .unwrap();
            let (state, effective) = read_back(&persist);
            assert_eq!(effective, live.config, "step {i}");
            assert_eq!(state.effective, live.config.to_toml().unwrap(), "step {i}");
            assert_eq!(state.base, persist.base_text, "step {i}");
            assert_eq!(state.generation, persist.generation, "step {i}");
            assert_eq!(state.pins.len(), live.pins.len(), "step {i}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn atomic_write_replaces_whole() {
        let dir = std::env::temp_dir().join(format!("qs-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_atomic(&dir, "x", b"one").unwrap();
        write_atomic(&dir, "x", b"two").unwrap();
        assert_eq!(std::fs::read(dir.join("x")).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// `qswitch config ...`.
#[derive(clap::Subcommand, Debug)]
pub enum ConfigCmd {
    /// Print the effective configuration (the file plus live changes) as TOML that
    /// `qswitch run --config` accepts.
    Dump,
}

/// Runs a `config` subcommand.
pub fn cli(control: &Path, cmd: ConfigCmd) -> anyhow::Result<()> {
    match cmd {
        ConfigCmd::Dump => match qswitch_api::client::call(control, &Request::ConfigDump)? {
            Response::Config { toml } => {
                print!("{toml}");
                Ok(())
            }
            _ => bail!("unexpected reply"),
        },
    }
}
