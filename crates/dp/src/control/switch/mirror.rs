//! Mirror sessions, added and removed live ([`crate::mirror`] has the data path).

use std::sync::Arc;

use qswitch_api::config::MirrorConfig;
use qswitch_api::request::MirrorInfo;

use super::{Switch, SwitchError};
use crate::mirror::{Output, Session};
use crate::table::PortEntry;

impl Switch {
    /// Starts a mirror session: checked against the ports and the other sessions (one-line
    /// errors), its thread started, its sources' and output's hooks set, and the table
    /// republished (the output leaves its flood domain and forgets what it learned).
    pub fn mirror_add(&self, config: &MirrorConfig) -> Result<(), SwitchError> {
        let mut ctl = self.control.lock();
        let table = self.shared.ports.load_full();
        let names: Vec<&str> = table
            .iter()
            .flatten()
            .map(|p| p.config.name.as_str())
            .collect();
        config
            .problem(&names, ctl.mirrors.iter().map(|s| &s.config))
            .map_err(SwitchError::Mirror)?;
        let find = |name: &str| -> Arc<PortEntry> {
            // Checked above: every name is a port.
            table
                .iter()
                .flatten()
                .find(|p| p.config.name == name)
                .cloned()
                .expect("checked")
        };
        let out = match (&config.output, &config.remote) {
            (Some(o), _) => Output::Port(find(o)),
            (None, Some(r)) => Output::erspan(r.dst, r.session, r.src, r.ttl).map_err(|e| {
                SwitchError::Mirror(format!(
                    "mirror '{}': cannot open a raw GRE socket: {e}",
                    config.name
                ))
            })?,
            (None, None) => unreachable!("checked: an output or a remote"),
        };
        let session = Arc::new(Session::new(config.clone()));
        session.start(out).map_err(|e| {
            SwitchError::Mirror(format!(
                "mirror '{}': cannot start its thread: {e}",
                config.name
            ))
        })?;
        ctl.mirrors.push(session);
        self.set_mirror_hooks(&ctl.mirrors);
        if let Some(o) = &config.output {
            self.shared.fdb.forget_port(find(o).id);
        }
        drop(table);
        self.apply(&mut ctl, Some((*self.shared.ports.load_full()).clone()));
        // Sources and the output leave the veth fast path (the workers must see them).
        self.sync_fastpath(self.shared.now());
        tracing::info!(mirror = %config.name, "mirror session added");
        Ok(())
    }

    /// Stops and removes a mirror session.
    pub fn mirror_del(&self, name: &str) -> Result<(), SwitchError> {
        let mut ctl = self.control.lock();
        let Some(i) = ctl.mirrors.iter().position(|s| s.config.name == name) else {
            return Err(SwitchError::Mirror(format!(
                "mirror '{name}' does not exist"
            )));
        };
        let session = ctl.mirrors.remove(i);
        self.set_mirror_hooks(&ctl.mirrors);
        self.apply(&mut ctl, Some((*self.shared.ports.load_full()).clone()));
        self.sync_fastpath(self.shared.now());
        drop(ctl);
        session.stop();
        tracing::info!(mirror = %name, "mirror session removed");
        Ok(())
    }

    /// The sessions as configured, in the order they were added.
    pub fn mirror_configs(&self) -> Vec<MirrorConfig> {
        (self.control.lock().mirrors.iter())
            .map(|s| s.config.clone())
            .collect()
    }

    /// The sessions and their counters.
    pub fn mirrors(&self) -> Vec<MirrorInfo> {
        (self.control.lock().mirrors.iter())
            .map(|s| MirrorInfo {
                config: s.config.clone(),
                copies: s.copies(),
                drops: s.drops(),
                sent: s.sent(),
            })
            .collect()
    }

    /// The mirror session that uses port `name` (as a source or output), if any.
    pub(super) fn mirror_using(mirrors: &[Arc<Session>], name: &str) -> Option<String> {
        mirrors
            .iter()
            .find(|s| {
                s.config.output.as_deref() == Some(name)
                    || s.config.sources.iter().any(|p| p == name)
            })
            .map(|s| s.config.name.clone())
    }

    /// Every port's hook from `mirrors`.
    fn set_mirror_hooks(&self, mirrors: &[Arc<Session>]) {
        for p in self.shared.ports.load().iter().flatten() {
            let name = p.config.name.as_str();
            let sources: Vec<Arc<dyn crate::table::MirrorSession>> = (mirrors.iter())
                .filter(|s| s.config.sources.iter().any(|x| x == name))
                .map(|s| s.clone() as Arc<dyn crate::table::MirrorSession>)
                .collect();
            let output = mirrors
                .iter()
                .any(|s| s.config.output.as_deref() == Some(name));
            p.mirror.set(sources, output);
        }
    }

    /// Stops every session (at shutdown: their threads hold output ports).
    pub(super) fn stop_mirrors(&self) {
        let sessions = std::mem::take(&mut self.control.lock().mirrors);
        for s in sessions {
            s.stop();
        }
    }
}
