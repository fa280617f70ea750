//! Flow export on and off: the tap the workers feed ([`crate::export::tap`]), published with
//! the port table so a worker picks it up between bursts, as it does a port change.

use std::sync::Arc;

use super::Switch;
use crate::export::{ExportTap, TapConfig};

impl Switch {
    /// Starts (or changes, or with `None` stops) what the workers offer forwarded frames
    /// to. Returns the tap that was in place: once this returns no worker feeds it any
    /// more, so the exporter may flush its caches and send what it holds.
    pub fn set_export(&self, config: Option<TapConfig>) -> Option<Arc<ExportTap>> {
        let mut ctl = self.control.lock();
        let tap = config
            .filter(|c| c.ipfix.is_some() || c.sflow.is_some())
            .map(|c| Arc::new(ExportTap::new(c, self.workers.len())));
        let old = self.shared.export.swap(tap);
        let table = (*self.shared.ports.load_full()).clone();
        self.apply(&mut ctl, Some(table));
        old
    }

    /// The tap the workers feed now, if export is on.
    pub fn export_tap(&self) -> Option<Arc<ExportTap>> {
        self.shared.export.load_full()
    }

    /// Every port's name and ifIndex in exported records ([`crate::export::tap::if_index`]).
    pub fn export_if_indexes(&self) -> Vec<(String, u32)> {
        self.shared
            .ports
            .load()
            .iter()
            .flatten()
            .map(|p| (p.config.name.clone(), crate::export::tap::if_index(p.id)))
            .collect()
    }
}
