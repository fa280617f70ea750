//! The port kinds' shared machinery, one driver per kind that has any, owned by the switch
//! (BESS's drivers, Cloud Hypervisor's thread helper): built from the switch's [`Options`],
//! its threads started through the switch's one spawn helper, stopped with the switch.
//! Nothing of it is process-wide: two switches in one process share nothing.
//!
//! | driver | what it holds | thread |
//! |---|---|---|
//! | [`VhostDriver`] | the vhost-user event loop ([`Reactor`]), the socket group, the guest memory cap | `qs-vhost`, started with the first vhost-user port, stopped by [`Switch::shutdown`](super::Switch::shutdown) |
//! | [`VethDriver`] | the kernel fast path's maps, made with the first veth port; mirrors the fdb into them | none (the housekeeping thread calls [`VethDriver::sync`]) |
//! | `vxlan` ([`VxlanGroups`]) | the `SO_REUSEPORT` groups of the VXLAN ports' receive sockets | none |
//!
//! Tap, gen, inject and afxdp ports need nothing shared.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use super::{Options, MAX_PORTS};
use crate::fdb::Fdb;
use crate::port::veth::{FastPath, OverlayPort};
use crate::port::vhost_user::{Reactor, Settings as VhostSettings};
use crate::port::vxlan::VxlanGroups;
use crate::port::Device;
use crate::table::{PortEntry, PortTable, Shared, WorkerShared};

/// Every driver of a switch.
pub(crate) struct Drivers {
    pub(crate) vhost: VhostDriver,
    pub(crate) veth: VethDriver,
    pub(crate) vxlan: VxlanGroups,
}

impl Drivers {
    pub(crate) fn new(options: &Options) -> Drivers {
        Drivers {
            vhost: VhostDriver {
                settings: VhostSettings {
                    socket_group: options.vhost_group,
                    max_guest_memory: options.vhost_max_guest_memory,
                },
                running: Mutex::new(None),
            },
            veth: VethDriver {
                fastpath: Mutex::new(None),
            },
            vxlan: VxlanGroups::default(),
        }
    }

    /// The names of the drivers' running threads.
    pub(crate) fn thread_names(&self) -> Vec<String> {
        let vhost = self.vhost.running.lock();
        vhost
            .iter()
            .filter_map(|(_, t)| t.thread().name().map(str::to_string))
            .collect()
    }

    /// Stops the drivers' threads (after the ports are gone).
    pub(crate) fn stop(&self) {
        self.vhost.stop();
    }
}

/// vhost-user: the event loop of every vhost-user port of the switch.
pub(crate) struct VhostDriver {
    settings: VhostSettings,
    running: Mutex<Option<(Reactor, JoinHandle<()>)>>,
}

impl VhostDriver {
    /// The event loop, started on first use (thread `qs-vhost`, through the switch's spawn
    /// helper: a panic in it stops the switch with a message naming the thread).
    /// A ring that starts wakes `workers` (see `Port::rx_dormant`); so does a port's first
    /// connection, which makes its wake-up fds (flagged: the workers register them).
    pub(crate) fn reactor(
        &self,
        shared: &Arc<Shared>,
        workers: &[Arc<WorkerShared>],
    ) -> std::io::Result<Reactor> {
        let mut running = self.running.lock();
        if let Some((r, _)) = running.as_ref() {
            return Ok(r.clone());
        }
        let (reactor, event_loop) = Reactor::new(self.settings.clone())?;
        let workers = workers.to_vec();
        reactor.on_ring_start(move || {
            for w in &workers {
                w.rx_fds_changed.store(true, Ordering::Release);
                let _ = w.wake.notify();
            }
        });
        let t = super::spawn(shared, "qs-vhost".into(), &[], move |_| event_loop.run())?;
        *running = Some((reactor.clone(), t));
        Ok(reactor)
    }

    /// The event loop's watchdog ticks and port looks so far ((0, 0) before it starts).
    pub(crate) fn watchdog_looks(&self) -> (u64, u64) {
        self.running
            .lock()
            .as_ref()
            .map_or((0, 0), |(r, _)| r.watchdog_looks())
    }

    /// Ends the event loop and waits for its thread.
    fn stop(&self) {
        let running = self.running.lock().take();
        if let Some((r, t)) = running {
            r.stop();
            let _ = t.join();
        }
    }
}

/// veth: the kernel fast path shared by the switch's veth ports.
pub(crate) struct VethDriver {
    fastpath: Mutex<Option<Arc<FastPath>>>,
}

impl VethDriver {
    /// The fast path's maps, made on first use. Its counter array is indexed by port id, so
    /// it covers every id a port may have ([`MAX_PORTS`]): a veth port keeps its fast path
    /// whatever slot it gets, at 40 bytes per slot and CPU (640 KiB per possible CPU, made
    /// only once a veth port asks for the fast path). A smaller array would have left the
    /// veth ports of a large switch on the slow path by the accident of their slot.
    pub(crate) fn fastpath(&self) -> std::io::Result<Arc<FastPath>> {
        let mut fp = self.fastpath.lock();
        if let Some(f) = fp.as_ref() {
            return Ok(f.clone());
        }
        let f = Arc::new(FastPath::new(MAX_PORTS as u32)?);
        *fp = Some(f.clone());
        Ok(f)
    }

    /// The fast path's maps if a veth port made them.
    pub(crate) fn current(&self) -> Option<Arc<FastPath>> {
        self.fastpath.lock().clone()
    }

    /// Mirrors the fdb into the fast path, if there is one, for the ports of `table` whose
    /// fast path is on ([`eligible`]).
    pub(crate) fn sync(&self, table: &PortTable, fdb: &Fdb, now: u64) {
        let Some(fp) = self.current() else {
            return;
        };
        let ports: HashMap<u16, (u32, u16)> = table
            .iter()
            .flatten()
            .filter_map(|p| eligible(p).map(|ifindex| (p.id.0, (ifindex, p.vlan))))
            .collect();
        let overlay: Vec<OverlayPort> = table.iter().flatten().filter_map(|p| overlay(p)).collect();
        fp.sync(ports, &overlay, fdb, now);
    }
}

/// The veth ifindex of a port whose fast path is on, `None` for every other port: see the
/// docs of [`crate::port::veth`] for what keeps a port out.
pub(crate) fn eligible(p: &PortEntry) -> Option<u32> {
    let Device::Veth(v) = &p.dev else {
        return None;
    };
    let policy = p.policy.load();
    let qos = p.qos.settings();
    // Storm control needs nothing here: broadcast, multicast and unknown unicast always
    // take the slow path.
    let plain = policy.settings.vlans.is_empty()
        && !policy.settings.security.checks_frames()
        && p.config.capacity.is_none()
        && qos.min.is_none()
        && qos.max.is_none()
        && !p.capture.on()
        && !p.mirror.on()
        && !p.disabled.get()
        // The firewall runs in userspace: a port with security groups leaves the fast path
        // both ways (its addresses are not mirrored, so the kernel hands frames to it up).
        // The live value: `port set --security-groups` changes it.
        && policy.settings.security_groups.is_empty();
    (v.fastpath() && plain).then_some(v.ifindex())
}

/// A VXLAN port whose remote MACs veth ports may reach in the kernel (docs/overlay.md,
/// "veth ports across hosts"): an access port with no per-frame policy, as for a veth port
/// in [`eligible`] (its frames then need the workers).
fn overlay(p: &PortEntry) -> Option<OverlayPort> {
    let Device::Vxlan(v) = &p.dev else {
        return None;
    };
    let policy = p.policy.load();
    let qos = p.qos.settings();
    let plain = policy.settings.vlans.is_empty()
        && !policy.settings.security.checks_frames()
        && qos.min.is_none()
        && qos.max.is_none()
        && !p.capture.on()
        && !p.mirror.on()
        && !p.disabled.get()
        && p.config.security_groups.is_empty();
    plain.then(|| OverlayPort {
        port: p.id,
        vlan: p.vlan,
        vxlan: v.clone(),
    })
}
