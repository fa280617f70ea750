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
//! # Ordering
//! Every change (port add/del, qos set, placement pin and mode, reload) runs under one mutex,
//! [`Persist`]'s: the change is applied to the switch, then recorded, then acknowledged, all
//! while holding it. Two concurrent changes are therefore recorded in the order they were
//! applied. A change whose record cannot be written is undone and reported as an error, so
//! an acknowledged change is on disk and an unacknowledged one is either undone or (after a
//! crash between apply and record) absent after a restart.
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
use qswitch_api::config::{PortConfig, QosConfig, QosSettings, Rate, Weight};
use qswitch_api::{Config, Request, Response};
use qswitch_dp::Switch;
use serde::{Deserialize, Serialize};

/// The state file's name inside the state directory.
pub const STATE_FILE: &str = "state.json";
const VERSION: u32 = 1;

/// What runs: the effective configuration and the pins.
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub config: Config,
    /// (port, queue) -> CPU.
    pub pins: BTreeMap<(String, u16), usize>,
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
    live: Live,
    generation: u64,
    /// `live.config.ports[i]` as `"\n" + [[port]] TOML`, escaped for a JSON string; empty
    /// until the first commit (see [`Persist::state_bytes`]).
    rendered: Vec<String>,
    /// `base_text` escaped for a JSON string.
    base_escaped: String,
}

/// What start-up found: the configuration to start with, its pins, and the record.
pub struct Start {
    pub persist: Persist,
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
            live: fresh.clone(),
            generation: 0,
            rendered: Vec::new(),
            base_escaped: {
                let quoted = serde_json::to_string(text)?;
                quoted[1..quoted.len() - 1].to_string()
            },
        };
        let Some(dir) = persist.dir.clone() else {
            return Ok(Start { persist, notes });
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
                return Ok(Start { persist, notes });
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
                return Ok(Start { persist, notes });
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
        persist.live = merged;
        persist.generation = state.generation;
        Ok(Start { persist, notes })
    }

    /// The configuration to run.
    pub fn live(&self) -> &Live {
        &self.live
    }

    /// `config dump`: the effective configuration, and the pins as comments.
    pub fn dump(&self) -> anyhow::Result<String> {
        let mut s = self.live.config.to_toml().context("cannot write TOML")?;
        if !self.live.pins.is_empty() {
            s.push_str(
                "\n# Placement pins (live state only; `qswitch placement pin` sets them):\n",
            );
            for ((port, queue), cpu) in &self.live.pins {
                s.push_str(&format!("#   {port} queue {queue} -> CPU {cpu}\n"));
            }
        }
        Ok(s)
    }

    /// The state file's bytes for `live` (generation `generation`, file text `base_text`) and
    /// the port fragments to keep for the next call.
    ///
    /// The file is JSON whose `effective` string is the TOML of [`Config::to_toml`]. It is
    /// assembled from pieces kept between changes: each port's `[[port]]` TOML, already
    /// escaped as JSON, in [`Persist::rendered`] (aligned with `self.live`'s ports), and the
    /// escaped file text. A change re-renders only the ports it touched: rendering and
    /// escaping a thousand unchanged ports made every `port add` at that scale several times
    /// slower than at ten. JSON escaping works per character, so the escaped pieces
    /// concatenated are the escaped whole; the file reads back with [`StateFile`].
    fn state_bytes(
        &self,
        live: &Live,
        generation: u64,
        base_escaped: &str,
    ) -> anyhow::Result<(Vec<u8>, Vec<String>)> {
        let escape = |text: &str| -> anyhow::Result<String> {
            let quoted = serde_json::to_string(text)?;
            Ok(quoted[1..quoted.len() - 1].to_string())
        };
        let aligned = self.rendered.len() == self.live.config.ports.len();
        let old: HashMap<&str, usize> = if aligned {
            (self.live.config.ports.iter().enumerate())
                .map(|(i, p)| (p.name.as_str(), i))
                .collect()
        } else {
            HashMap::new()
        };
        let mut rendered = Vec::with_capacity(live.config.ports.len());
        for p in &live.config.ports {
            let kept = old
                .get(p.name.as_str())
                .filter(|&&i| self.live.config.ports[i] == *p)
                .map(|&i| self.rendered[i].clone());
            rendered.push(match kept {
                Some(text) => text,
                None => {
                    let toml = qswitch_api::config::port_toml(p).context("cannot write TOML")?;
                    escape(&format!("\n{toml}"))?
                }
            });
        }
        let switch = escape(&live.config.switch_toml().context("cannot write TOML")?)?;
        let pins: Vec<Pin> = (live.pins.iter())
            .map(|((port, queue), cpu)| Pin {
                port: port.clone(),
                queue: *queue,
                cpu: *cpu,
            })
            .collect();
        let size =
            base_escaped.len() + switch.len() + rendered.iter().map(String::len).sum::<usize>();
        let mut out = Vec::with_capacity(size + 512);
        write!(
            out,
            "{{\n  \"version\": {VERSION},\n  \"generation\": {generation},\n  \"config_path\": {},\n  \"base\": \"{base_escaped}\",\n  \"effective\": \"{switch}",
            serde_json::to_string(&self.config_path.display().to_string())?,
        )?;
        for text in &rendered {
            out.extend_from_slice(text.as_bytes());
        }
        write!(
            out,
            "\",\n  \"pins\": {}\n}}\n",
            serde_json::to_string(&pins)?
        )?;
        Ok((out, rendered))
    }

    /// Makes `live` the recorded state (and the in-memory one), with `base` as the file's
    /// text when given. Durable before it returns.
    pub fn commit(&mut self, live: Live, base: Option<(Config, String)>) -> anyhow::Result<()> {
        let mut rendered = Vec::new();
        let mut base_escaped = None;
        if let Some(dir) = &self.dir {
            if let Some((_, text)) = &base {
                let quoted = serde_json::to_string(text)?;
                base_escaped = Some(quoted[1..quoted.len() - 1].to_string());
            }
            let escaped = base_escaped.as_deref().unwrap_or(&self.base_escaped);
            let (bytes, r) = self.state_bytes(&live, self.generation + 1, escaped)?;
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
        self.live = live;
        self.rendered = rendered;
        self.generation += 1;
        Ok(())
    }

    /// Applies one change request to the switch and records it; undoes it if the record
    /// fails. Called with the daemon's persistence mutex held.
    pub fn change(&mut self, sw: &Switch, req: Request) -> anyhow::Result<Response> {
        let mut next = self.live.clone();
        match req {
            Request::PortAdd { port } => {
                sw.add_port(&port)?;
                next.config.ports.push(port.clone());
                self.commit(next, None).inspect_err(|_| {
                    let _ = sw.del_port(&port.name);
                })?;
            }
            Request::PortDel { name } => {
                sw.del_port(&name)?;
                let old = next.config.ports.iter().find(|p| p.name == name).cloned();
                next.config.ports.retain(|p| p.name != name);
                next.pins.retain(|(p, _), _| *p != name);
                self.commit(next, None).inspect_err(|_| {
                    if let Some(old) = &old {
                        let _ = sw.add_port(old);
                    }
                })?;
            }
            Request::QosSet {
                port,
                min,
                max,
                weight,
                clear,
            } => {
                let old = next
                    .config
                    .ports
                    .iter()
                    .find(|p| p.name == port)
                    .map(PortConfig::qos_settings);
                let update = qswitch_dp::qos::QosUpdate {
                    min,
                    max,
                    weight,
                    clear,
                };
                let new = sw.qos_set(&port, &update)?;
                if let Some(p) = next.config.ports.iter_mut().find(|p| p.name == port) {
                    p.qos = qos_config(new);
                }
                self.commit(next, None).inspect_err(|_| {
                    if let Some(old) = old {
                        let _ = sw.qos_set(&port, &qos_update(old));
                    }
                })?;
            }
            Request::PlacementPin { port, queue, cpu } => {
                let key = (port.clone(), queue);
                let old = next.pins.get(&key).copied();
                sw.pin(&port, queue, cpu)?;
                match cpu {
                    Some(c) => next.pins.insert(key, c),
                    None => next.pins.remove(&key),
                };
                self.commit(next, None).inspect_err(|_| {
                    let _ = sw.pin(&port, queue, old);
                })?;
            }
            Request::PortSet { name, update } => {
                let old = sw.port_policy(&name)?;
                sw.update_port_policy(&name, &update)?;
                let now = sw.port_configs().into_iter().find(|p| p.name == name);
                if let (Some(now), Some(p)) =
                    (now, next.config.ports.iter_mut().find(|p| p.name == name))
                {
                    p.vlans = now.vlans;
                    p.security = now.security;
                    p.storm = now.storm;
                    p.link_local_forward = now.link_local_forward;
                    p.bpdu_guard = now.bpdu_guard;
                }
                self.commit(next, None).inspect_err(|_| {
                    let _ = sw.set_port_policy(&name, old.clone());
                })?;
            }
            Request::PlacementMode { mode } => {
                let old = next.config.switch.placement;
                sw.set_placement_mode(mode);
                next.config.switch.placement = mode;
                self.commit(next, None).inspect_err(|_| {
                    sw.set_placement_mode(old);
                })?;
            }
            Request::Reload => {
                let changes = crate::reload::reload(self, sw)?;
                return Ok(Response::Reloaded { changes });
            }
            other => bail!("not a change: {other:?}"),
        }
        Ok(Response::Ok)
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

/// The settings as a port's `qos` table (`None` for the defaults).
pub fn qos_config(s: QosSettings) -> Option<QosConfig> {
    if s == QosSettings::default() {
        return None;
    }
    Some(QosConfig {
        min: s.min.map(Rate::from_bps),
        max: s.max.map(Rate::from_bps),
        weight: (s.weight != 1)
            .then(|| Weight::try_from(s.weight).ok())
            .flatten(),
    })
}

/// An update that sets exactly `s`.
pub fn qos_update(s: QosSettings) -> qswitch_dp::qos::QosUpdate {
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
    let config = Config {
        switch,
        ports,
        // The firewall's tables have no live changes yet: the file's.
        firewall: file.firewall,
        security_groups: file.security_groups.clone(),
    };
    let pins = live
        .pins
        .iter()
        .filter(
            |((port, _), _)| match (find(&config, port), find(&live.config, port)) {
                (Some(a), Some(b)) => same_but_qos(a, b),
                _ => false,
            },
        )
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    Live { config, pins }
}

/// Whether two port configurations differ at most in their QoS settings.
pub fn same_but_qos(a: &PortConfig, b: &PortConfig) -> bool {
    let (mut a, mut b) = (a.clone(), b.clone());
    a.qos = None;
    b.qos = None;
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
        for (i, step) in steps.iter().enumerate() {
            let mut live = persist.live().clone();
            step(&mut live);
            let base = (i == 3).then(|| {
                let t = format!("# \"Größe\"\\ {i}\n{text}");
                (cfg(&t), t)
            });
            persist.commit(live.clone(), base.clone()).unwrap();
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
