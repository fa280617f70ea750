//! Looking at traffic without changing it: packet capture on a port and `trace`.

use std::sync::Arc;

use qswitch_api::request::TraceReport;

use super::{Switch, SwitchError};
use crate::capture::{Capture, Spec, Tap};
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
            &entry,
            frame,
            self.shared.now(),
        ))
    }
}
