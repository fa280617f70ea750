//! Looking at traffic without changing it: packet capture on a port and `trace`.

use std::sync::{Arc, Weak};

use qswitch_api::request::TraceReport;

use super::{Switch, SwitchError};
use crate::capture::{Record, Spec, Tap};
use crate::table::PortEntry;

impl Switch {
    fn port_entry(&self, name: &str) -> Result<Arc<PortEntry>, SwitchError> {
        self.shared
            .ports
            .load()
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .cloned()
            .ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))
    }

    /// Starts capturing on port `name` (one capture per port at a time). The workers copy
    /// matching frames into the capture's preallocated ring from their next burst on; the
    /// capture stops when the returned handle is dropped.
    pub fn capture(&self, name: &str, spec: Spec) -> Result<Capture, SwitchError> {
        let entry = self.port_entry(name)?;
        if let Some(q) = spec.queue {
            if q >= entry.config.queues {
                return Err(SwitchError::NoSuchQueue {
                    port: name.to_string(),
                    queue: q,
                    queues: entry.config.queues,
                });
            }
        }
        let tap = Arc::new(Tap::new(spec).map_err(SwitchError::CaptureMemory)?);
        if !entry.capture.attach(tap.clone()) {
            return Err(SwitchError::CaptureBusy(name.to_string()));
        }
        Ok(Capture {
            tap,
            port: Arc::downgrade(&entry),
            name: name.to_string(),
        })
    }

    /// What the switch would do with `frame` arriving on port `name` now; changes nothing.
    pub fn trace(&self, name: &str, frame: &[u8]) -> Result<TraceReport, SwitchError> {
        let entry = self.port_entry(name)?;
        let table = self.shared.ports.load_full();
        Ok(crate::trace::trace(
            &table,
            &self.shared.fdb,
            &self.shared.firewall,
            &entry,
            frame,
            self.shared.now(),
        ))
    }
}

/// A running capture on one port; it stops (detaches) when dropped.
#[derive(Debug)]
pub struct Capture {
    pub(crate) tap: Arc<Tap>,
    pub(crate) port: Weak<PortEntry>,
    pub(crate) name: String,
}

impl Capture {
    /// The port's name.
    pub fn port(&self) -> &str {
        &self.name
    }

    pub fn tap(&self) -> &Tap {
        &self.tap
    }

    /// Moves up to `max` records into `out`.
    pub fn drain(&self, out: &mut Vec<Record>, max: usize) -> usize {
        self.tap.drain(out, max)
    }

    /// Moves up to `max` records and about `max_bytes` of frame data into `out`.
    pub fn drain_within(&self, out: &mut Vec<Record>, max: usize, max_bytes: usize) -> usize {
        self.tap.drain_within(out, max, max_bytes)
    }

    /// Whether the port is gone from the switch (the capture can end).
    pub fn port_gone(&self) -> bool {
        self.port.strong_count() == 0
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(p) = self.port.upgrade() {
            p.capture.detach(&self.tap);
        }
    }
}
