//! Ports: where frames enter and leave the switch.
//!
//! A port has one or more rx queues. Each rx queue is polled by exactly one worker at a time
//! ([`Port::rx_burst`]); any worker may transmit to any port ([`Port::tx_burst`]), passing its
//! own worker id so a port can keep per-worker transmit state without locks.
//!
//! | kind | module | rx | tx |
//! |---|---|---|---|
//! | TAP | [`tap`] | `read` per frame on the queue's fd (vnet header + frame) | `write` on the worker's queue fd |
//! | gen | [`gen`] | synthesised frames at a rate | validated and counted (sink) |
//! | VXLAN | [`vxlan`] | `recvmmsg` on (local, dstport): decapsulated in place, learned, checked | head-end replication; `sendmmsg` of header + frame from a source-port pool picked by flow hash |
//! | AF_XDP uplink | [`afxdp`] | one AF_XDP socket per NIC queue (copy out of the UMEM); AF_PACKET ring as fallback | TSO segmented, checksums completed, into the socket of queue `worker % n` (or `sendmmsg`) |
//! | bond | [`bond`] | its members' queues; LACPDUs to the bond's thread; only from members that take frames now | by the active member or the frame's hash bucket's |
//! | veth | [`veth`] | what the kernel fast path does not forward itself, from a slow path TAP | into the slow path TAP, which sends it into the namespace |
//! | inject (tests) | [`inject`] | frames a test queued | captured for the test |
//!
//! A port made of ports (a bond) is [`members::Members`]: member devices, each with its own
//! link state, behind one port.

pub mod afxdp;
pub mod bond;
pub mod gen;
#[cfg(any(test, feature = "test-utils"))]
pub mod inject;
pub mod members;
pub mod tap;
pub mod veth;
pub mod vhost_user;
pub mod vxlan;

use std::os::fd::RawFd;

use crate::packet::Pkt;
use crate::stats::DropTally;

/// What a [`Port::tx_burst`] did with the frames it was given.
#[derive(Debug, Default, Clone, Copy)]
pub struct TxDone {
    pub packets: u32,
    pub bytes: u64,
}

/// What the switch may learn from the frames of a port's last rx burst, frame `i` at bit
/// `i`: whether its source MAC may be learned at all, and whether it may move an address
/// that is live on another port. Every port but VXLAN says [`RxLearn::ALL`]; a VXLAN port
/// says what its underlay proves (see [`vxlan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxLearn {
    pub learn: u32,
    pub moves: u32,
    /// Whether the port wants [`Port::rx_accepted`] after the burst.
    pub report: bool,
}

const _: () = assert!(crate::packet::BURST <= 32, "one bit per frame of a burst");

impl RxLearn {
    /// Every frame may be learned and may move an address.
    pub const ALL: RxLearn = RxLearn {
        learn: u32::MAX,
        moves: u32::MAX,
        report: false,
    };
}

/// A port's data path. Implementations are shared between workers (`&self`); an rx queue is
/// only ever polled by its one owner, so per-queue rx state needs no contention handling.
pub trait Port: Send + Sync {
    /// Fills `pkts` from the front with up to `pkts.len()` received frames and returns how
    /// many. Frames the port itself rejects are counted in `drops`, not returned. `now` is the
    /// switch clock in nanoseconds.
    fn rx_burst(&self, queue: u16, pkts: &mut [Pkt], now: u64, drops: &mut DropTally) -> usize;

    /// Transmits `pkts[i]` for each `i` in `sel` (one destination, many frames). Frames that
    /// cannot be sent are counted in `drops`. `worker` is the calling worker's id.
    fn tx_burst(
        &self,
        worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        drops: &mut DropTally,
    ) -> TxDone;

    /// A file descriptor that becomes readable when `queue` has frames, for sleeping in epoll.
    /// `None` for ports that are not fd-driven, or not yet: a port whose fd comes later
    /// (a vhost-user port's first connection) stays the same fd from then on and announces
    /// it through `WorkerShared::rx_fds_changed` (see `worker.rs`).
    fn rx_fd(&self, queue: u16) -> Option<RawFd>;

    /// Called before the worker sleeps: enable the queue's wake-up source (guest kicks) and
    /// say whether sleeping is safe (`false`: frames arrived meanwhile, poll again).
    fn rx_arm(&self, _queue: u16) -> bool {
        true
    }

    /// What the switch may learn from the frames the last [`Port::rx_burst`] of `queue`
    /// returned.
    #[inline]
    fn rx_learn(&self, _queue: u16) -> RxLearn {
        RxLearn::ALL
    }

    /// After the switch took the last burst of `queue`, when [`Port::rx_learn`] asked for it
    /// (`report`): `accepted` has bit `i` set for each frame the switch accepted (classified,
    /// allowed into a VLAN, passed port security) and learned the source of (not
    /// [`crate::fdb::Learn::Held`]). A port that learns from frames (VXLAN's remote table)
    /// learns from those only.
    fn rx_accepted(&self, _queue: u16, _accepted: u32) {}

    /// Whether `queue` has failed for good (its fd must no longer be polled).
    fn rx_dead(&self, _queue: u16) -> bool {
        false
    }

    /// Whether `queue` cannot receive until something wakes its worker (its fd or the
    /// worker's wake eventfd): a vhost-user port with no frontend, which wakes the workers
    /// when a ring starts. A worker whose queues are all dormant sleeps without a timeout.
    fn rx_dormant(&self, _queue: u16) -> bool {
        false
    }

    /// For ports that produce frames on their own schedule (gen): nanoseconds from `now` until
    /// `queue` has something to deliver; `None` when it never will (or is fd-driven).
    fn rx_due_in(&self, _queue: u16, _now: u64) -> Option<u64> {
        None
    }

    /// Offloads the port accepts on tx and produces on rx, for display.
    fn offloads(&self) -> Vec<&'static str> {
        Vec::new()
    }
}

/// Every kind of port, dispatched statically (one `match` per burst, no vtable).
#[derive(Debug)]
pub enum Device {
    Tap(tap::TapPort),
    Gen(gen::GenPort),
    VhostUser(vhost_user::VhostUserPort),
    /// Shared: the control plane (EVPN, `qswitch fdb`) keeps a handle to its remote table.
    Vxlan(std::sync::Arc<vxlan::VxlanPort>),
    AfXdp(afxdp::AfXdpPort),
    Veth(veth::VethPort),
    Bond(bond::BondPort),
    #[cfg(any(test, feature = "test-utils"))]
    Inject(std::sync::Arc<inject::InjectPort>),
}

macro_rules! each_device {
    ($self:expr, $d:ident => $e:expr) => {
        match $self {
            Device::Tap($d) => $e,
            Device::Gen($d) => $e,
            Device::VhostUser($d) => $e,
            Device::Vxlan($d) => $e,
            Device::AfXdp($d) => $e,
            Device::Veth($d) => $e,
            Device::Bond($d) => $e,
            #[cfg(any(test, feature = "test-utils"))]
            Device::Inject($d) => $e,
        }
    };
}

impl Port for Device {
    #[inline]
    fn rx_burst(&self, queue: u16, pkts: &mut [Pkt], now: u64, drops: &mut DropTally) -> usize {
        each_device!(self, d => d.rx_burst(queue, pkts, now, drops))
    }
    #[inline]
    fn tx_burst(
        &self,
        worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        drops: &mut DropTally,
    ) -> TxDone {
        each_device!(self, d => d.tx_burst(worker, pkts, sel, drops))
    }
    fn rx_fd(&self, queue: u16) -> Option<RawFd> {
        each_device!(self, d => d.rx_fd(queue))
    }
    fn rx_arm(&self, queue: u16) -> bool {
        each_device!(self, d => d.rx_arm(queue))
    }
    fn rx_dead(&self, queue: u16) -> bool {
        each_device!(self, d => d.rx_dead(queue))
    }
    fn rx_dormant(&self, queue: u16) -> bool {
        each_device!(self, d => d.rx_dormant(queue))
    }
    #[inline]
    fn rx_learn(&self, queue: u16) -> RxLearn {
        each_device!(self, d => d.rx_learn(queue))
    }
    fn rx_accepted(&self, queue: u16, accepted: u32) {
        each_device!(self, d => d.rx_accepted(queue, accepted))
    }
    fn rx_due_in(&self, queue: u16, now: u64) -> Option<u64> {
        each_device!(self, d => d.rx_due_in(queue, now))
    }
    fn offloads(&self) -> Vec<&'static str> {
        each_device!(self, d => d.offloads())
    }
}
