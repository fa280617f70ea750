//! vhost-user ports: QEMU/KVM guests, Cloud Hypervisor, DPDK virtio-user.
//!
//! ```text
//!  frontend (QEMU / virtio-user)          qswitch
//!  ┌──────────────────────┐  unix socket  ┌────────────────────────────────────────────┐
//!  │ vhost-user messages  │ ◀───────────▶ │ qs-vhost event loop (all ports): Handler   │
//!  │                      │               │   memory table, ring addresses, kick/call  │
//!  │ guest memory (memfd) │ ═══ mmap ════ │ VhostState { mem, vrings: [Mutex<Vring>] } │
//!  │ transmitq K (2K+1) ──┼── descriptors ┼─▶ rx_burst(K)  by the worker owning K      │
//!  │ receiveq K  (2K)   ◀─┼── descriptors ┼── tx_burst    by any worker                │
//!  └──────────────────────┘               └────────────────────────────────────────────┘
//! ```
//!
//! # Design: the workers own the vrings
//! `vhost-user-backend` runs its own epoll threads that wake on guest kicks. qswitch's
//! pinned workers must own the data path (busy-poll under load, no cross-thread hand-off), so
//! qswitch implements the protocol handler itself on top of the `vhost` crate's message
//! layer and lets workers access the rings directly: each vring sits behind a mutex that the
//! control plane takes only to reconfigure it. Guest kicks reach a sleeping worker through
//! a per-queue epoll instance that holds the current kick eventfd; the worker's own epoll
//! watches that instance, whose fd stays the same when the frontend reconnects and replaces
//! the kick fd.
//!
//! # An idle port holds one descriptor
//! A server-mode port with no frontend holds only its listening socket (a client-mode port
//! none): the kick epolls and the inject eventfd ([`WakeFds`]) are made when the first
//! frontend connects, so ten thousand idle ports fit in an open-file limit of 20 000. The
//! workers register a port's wake-up fd when they load the port table; one made later is
//! announced through the same hook as a ring start (wake the workers, flag them), and a
//! worker registers it before it next sleeps (see `worker.rs`). They stay until the port
//! goes, not released at a disconnect: the workers hold the fd's number in their own epoll,
//! and closing it under them would let the number be reused by another file.
//!
//! # One event loop for every port
//! [`Reactor`] (thread `qs-vhost`, see `reactor.rs`) listens, accepts, connects (client
//! mode, on timers) and runs the protocol for all ports: a port costs no thread and an idle
//! daemon sleeps. A message is parsed only once it has arrived whole, so a frontend cannot
//! stall the loop; [`HANDSHAKE_DEADLINE`] and [`MESSAGE_DEADLINE`] drop frontends that
//! connect and say nothing or stop mid-message.
//!
//! # Untrusted guests
//! Descriptor chains are walked by [`chain::walk`] (bounded, bounds-checked, no nested
//! indirect tables). A bad chain drops its packet (`bad_descriptor`); a ring whose avail
//! index jumps beyond the queue size, or whose used ring cannot be written, is stopped until
//! the frontend sets it up again. Each is logged once per ring. Protocol errors (wrong
//! message sizes, a socket closed mid-message) end the connection; the port waits for the
//! frontend to come back.
//!
//! # Untrusted frontends
//! - Guest memory: sealed against shrinking where the file allows it, otherwise covered by
//!   the `SIGBUS` handler of [`qswitch_sys::guestmap`] (a fault in guest memory becomes zero
//!   pages and a stopped port). Why both: sealing is exact but only memfds created with
//!   `MFD_ALLOW_SEALING` support it, and refusing the rest would refuse hugetlbfs-backed
//!   QEMU and DPDK frontends; the handler covers everything but needs the port to be
//!   stopped afterwards. At most [`Settings::max_guest_memory`] per port; unmapped on disconnect.
//! - Kick and call fds must be eventfds. Kicks are drained with `preadv2(RWF_NOWAIT)` (the
//!   frontend shares, and may clear, `O_NONBLOCK`); kicks that bring no frames faster than
//!   [`KICK_STORM`] a second stop waking the worker until the next watchdog tick. A call write the frontend made blocking
//!   (counter at its maximum, `O_NONBLOCK` cleared) is interrupted by the event loop's
//!   watchdog within 200 ms and the call fd dropped, so a worker never stays blocked and a
//!   ring lock is never held for long; the control plane reads ring state from atomics.
//!
//! # Live migration (docs/migration.md)
//! `VHOST_F_LOG_ALL` + `LOG_SHMFD`: SET_LOG_BASE maps the frontend's dirty log (sealed
//! against shrinking, large enough for guest memory); while LOG_ALL is negotiated every
//! write into guest memory is marked by guest-physical address ([`mem::GuestView`], the log
//! taken once per burst). GET_VRING_BASE takes the ring lock, so the worker's burst ends
//! first, and stops the ring. SEND_RARP queues a RARP from the guest's MAC for the next
//! `rx_burst` of queue 0 (waking its worker), so the switch learns the MAC on this port.
//! `CONFIGURE_MEM_SLOTS`: up to [`MAX_MEM_SLOTS`] regions.

pub mod chain;
mod handler;
pub mod mem;
mod reactor;
mod rings;

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;
use qswitch_sys::dirty_log::DirtyLog;
use qswitch_sys::epoll::Epoll;
use qswitch_sys::eventfd::EventFd;
use qswitch_sys::guestmap::MapOwner;
use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use virtio_bindings::virtio_config::{VIRTIO_F_IN_ORDER, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap};

use super::{Port, TxDone};
use crate::packet::Pkt;
use crate::rss::{Reta, Toeplitz};
use crate::stats::DropTally;

pub use handler::Handler;
pub use reactor::{EventLoop, Reactor, HANDSHAKE_DEADLINE, MESSAGE_DEADLINE, WATCHDOG};

/// Guest memory as a port maps it: regions whose mappings are registered for `SIGBUS`
/// recovery ([`qswitch_sys::guestmap`]).
pub type GuestMem = GuestMemoryMmap<MapOwner>;

/// Most queue pairs a port offers.
pub const MAX_PAIRS: u16 = 16;
/// Largest ring a frontend may set up.
pub const MAX_QUEUE_SIZE: u16 = 4096;
/// Default cap on the guest memory one port maps (the sum of its SET_MEM_TABLE regions):
/// 1 TiB. Generous for real VMs (NFV guests with a few hundred GiB of hugepages), while a
/// process's 128 TiB of user address space then needs more than a hundred hostile ports
/// to exhaust (a single frontend once mapped 128 TiB of sparse memfds, after which the
/// daemon could not even start threads). Mappings are `MAP_NORESERVE`: the cap bounds
/// address space, not memory. The switch's options change it ([`Settings`]).
pub const DEFAULT_MAX_GUEST_MEMORY: u64 = 1 << 40;

/// What the switch's options set for its vhost-user ports (held by their [`Reactor`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The group given the sockets of server-mode ports (`None`: the daemon's own). The
    /// sockets are mode 0660 either way.
    pub socket_group: Option<u32>,
    /// The most guest memory one port may map (bytes); applies to SET_MEM_TABLE and
    /// ADD_MEM_REG.
    pub max_guest_memory: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            socket_group: None,
            max_guest_memory: DEFAULT_MAX_GUEST_MEMORY,
        }
    }
}
/// `VHOST_USER_F_PROTOCOL_FEATURES`.
pub const F_PROTOCOL_FEATURES: u64 = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
/// `VHOST_F_LOG_ALL`: the frontend may ask for dirty-page logging (live migration).
pub const F_LOG_ALL: u64 = VhostUserVirtioFeatures::LOG_ALL.bits();

/// Memory slots a frontend may use (`VHOST_USER_GET_MAX_MEM_SLOTS`, the cap for
/// SET_MEM_TABLE and ADD_MEM_REG). 32: QEMU uses one or two regions for RAM plus one per
/// hot-plugged DIMM (its own default `slots=` limit for a pc machine is far lower than 32 in
/// practice), DPDK one per hugepage segment list; the data path resolves the first
/// [`mem::MAX_FAST_REGIONS`] regions up front and scans the rest, so a small table keeps
/// that scan short. The per-port cap on guest memory ([`Settings::max_guest_memory`]) applies to the
/// sum of all slots either way.
pub const MAX_MEM_SLOTS: usize = 32;

/// Virtio features qswitch offers.
pub const FEATURES: u64 = (1 << VIRTIO_NET_F_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6)
    | (1 << VIRTIO_NET_F_GUEST_ECN)
    | (1 << VIRTIO_NET_F_HOST_TSO4)
    | (1 << VIRTIO_NET_F_HOST_TSO6)
    | (1 << VIRTIO_NET_F_HOST_ECN)
    | (1 << VIRTIO_NET_F_MRG_RXBUF)
    | (1 << VIRTIO_NET_F_CTRL_VQ)
    | (1 << VIRTIO_NET_F_MQ)
    | (1 << VIRTIO_RING_F_INDIRECT_DESC)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_F_IN_ORDER)
    | (1 << VIRTIO_NET_F_GUEST_ANNOUNCE)
    | F_LOG_ALL
    | F_PROTOCOL_FEATURES;

/// Protocol features qswitch offers.
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::LOG_SHMFD
        | VhostUserProtocolFeatures::RARP
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
}

/// Names of negotiated feature bits, for `port list`.
pub fn feature_names(features: u64) -> Vec<&'static str> {
    const NAMES: &[(u32, &str)] = &[
        (VIRTIO_NET_F_CSUM, "csum"),
        (VIRTIO_NET_F_GUEST_CSUM, "guest_csum"),
        (VIRTIO_NET_F_GUEST_TSO4, "guest_tso4"),
        (VIRTIO_NET_F_GUEST_TSO6, "guest_tso6"),
        (VIRTIO_NET_F_GUEST_ECN, "guest_ecn"),
        (VIRTIO_NET_F_HOST_TSO4, "host_tso4"),
        (VIRTIO_NET_F_HOST_TSO6, "host_tso6"),
        (VIRTIO_NET_F_HOST_ECN, "host_ecn"),
        (VIRTIO_NET_F_MRG_RXBUF, "mrg_rxbuf"),
        (VIRTIO_NET_F_CTRL_VQ, "ctrl_vq"),
        (VIRTIO_NET_F_MQ, "mq"),
        (VIRTIO_RING_F_INDIRECT_DESC, "indirect_desc"),
        (VIRTIO_RING_F_EVENT_IDX, "event_idx"),
        (VIRTIO_F_VERSION_1, "version_1"),
        (VIRTIO_F_IN_ORDER, "in_order"),
        (VIRTIO_NET_F_GUEST_ANNOUNCE, "guest_announce"),
        (VIRTIO_F_LOG_ALL_BIT, "log_all"),
    ];
    NAMES
        .iter()
        .filter(|(b, _)| features & (1u64 << b) != 0)
        .map(|(_, n)| *n)
        .collect()
}

const VIRTIO_F_LOG_ALL_BIT: u32 = F_LOG_ALL.trailing_zeros();

/// Who opens the socket: qswitch listens (server; the frontend, QEMU
/// `-chardev socket,...,reconnect=1`, connects) or connects to the frontend's socket
/// (client; QEMU `server=on`), retrying every second. The port's `mode` key.
pub use qswitch_api::VhostMode as Mode;

/// One virtqueue as the device sees it.
#[derive(Debug)]
pub(crate) struct Vring {
    pub(crate) queue: Queue,
    pub(crate) kick: Option<File>,
    pub(crate) call: Option<File>,
    /// SET_VRING_ENABLE state.
    pub(crate) enabled: bool,
    /// Started by a kick fd, stopped by GET_VRING_BASE or a disconnect.
    pub(crate) started: bool,
    /// Stopped because the guest broke the ring; logged once.
    pub(crate) broken: bool,
    /// Guest notifications may be enabled: since the ring started (the guest's setting) or
    /// since `arm` before the worker slept. The next burst on the ring disables them.
    pub(crate) notify: bool,
    /// SET_VRING_ADDR was received (a ring may legally sit at guest address 0).
    pub(crate) addr_set: bool,
    /// The guest's avail index as last read (heads up to it are known to be there).
    pub(crate) avail_cached: u16,
    /// Used elements written but not yet published with the used index.
    pub(crate) used_pending: u16,
    /// The used index when the guest was last considered for a notification.
    pub(crate) used_signalled: u16,
    pub(crate) scratch: rings::Scratch,
    /// The next avail index at the last `arm` (a kick with no frame since is spurious).
    pub(crate) arm_avail: u16,
    /// Spurious kicks counted since `storm_start` (see [`KICK_STORM`]).
    pub(crate) storm_count: u32,
    pub(crate) storm_start: Option<std::time::Instant>,
}

/// Spurious kicks (a kick with no new frame) per second a transmit ring may cause before
/// its kicks stop waking the worker until the event loop's next watchdog tick (100 ms):
/// a frontend writing its kick eventfd in a loop costs the worker at most about this many
/// wake-ups a second, not one per write. Real guests kick only after queueing frames.
pub const KICK_STORM: u32 = 1000;

impl Vring {
    fn new() -> Vring {
        Vring {
            queue: Queue::new(MAX_QUEUE_SIZE).expect("MAX_QUEUE_SIZE is a valid queue size"),
            kick: None,
            call: None,
            enabled: false,
            started: false,
            broken: false,
            notify: false,
            addr_set: false,
            avail_cached: 0,
            used_pending: 0,
            used_signalled: 0,
            scratch: rings::Scratch::default(),
            arm_avail: 0,
            storm_count: 0,
            storm_start: None,
        }
    }

    /// Whether the data path may use the ring.
    #[inline]
    pub(crate) fn usable(&self) -> bool {
        self.enabled && self.started && !self.broken && self.queue.ready()
    }

    /// Signals the guest (call eventfd). False if the write blocked (the frontend
    /// saturated the counter and cleared O_NONBLOCK) and was interrupted by the watchdog:
    /// the call fd is then dropped.
    pub(crate) fn signal(&mut self, calls: &Arc<reactor::CallSlots>) -> bool {
        if let Some(call) = &self.call {
            if !reactor::signal_call(calls, call) {
                self.call = None;
                return false;
            }
        }
        true
    }
}

/// State shared by the protocol thread and the workers.
#[derive(Debug)]
pub(crate) struct VhostState {
    pub(crate) name: String,
    pub(crate) pairs: u16,
    pub(crate) mem: GuestMemoryAtomic<GuestMem>,
    /// 2 × pairs vrings: receiveqK = 2K, transmitqK = 2K + 1.
    pub(crate) vrings: Box<[Mutex<Vring>]>,
    /// The kick epolls and the inject eventfd, made on the first connection
    /// ([`VhostState::wake_fds`]) and kept until the port goes.
    pub(crate) wake: std::sync::OnceLock<WakeFds>,
    /// Bit K: pair K's kick fd is out of its epoll for a kick storm (until the event
    /// loop's next watchdog tick).
    pub(crate) kicks_muted: AtomicU32,
    pub(crate) features: AtomicU64,
    /// Bit K set: receiveq K is usable (enabled, started, not broken).
    pub(crate) rx_enabled: AtomicU32,
    /// Indirection table over the usable receive queues (rebuilt when they change).
    pub(crate) reta: ArcSwap<Reta>,
    /// The RSS hash (Microsoft's default key).
    pub(crate) rss: Toeplitz,
    pub(crate) connected: AtomicBool,
    /// Guest errors seen (bad chains, broken rings), for logs and tests.
    pub(crate) guest_errors: AtomicU64,
    /// The dirty log from SET_LOG_BASE (live migration), kept until the next one or a
    /// disconnect.
    pub(crate) log: ArcSwapOption<DirtyLog>,
    /// LOG_ALL negotiated and a log mapped: every write into guest memory marks its pages.
    /// The data path reads this once per burst.
    pub(crate) logging: AtomicBool,
    /// Page marks made in the dirty log (a page written twice counts twice).
    pub(crate) logged_pages: AtomicU64,
    /// Pages written while logging that lay beyond the log (a frontend's log too small for
    /// memory added later); the frontend may then miss them.
    pub(crate) log_missed: AtomicU64,
    /// RARP announcements injected for SEND_RARP.
    pub(crate) rarps: AtomicU64,
    /// Frames to hand the switch as if the guest had sent them (SEND_RARP), taken by the
    /// next `rx_burst` of queue 0.
    pub(crate) inject: Mutex<Vec<[u8; 60]>>,
    pub(crate) inject_pending: AtomicBool,
    /// The most guest memory the frontend may map ([`Settings::max_guest_memory`]).
    pub(crate) max_guest_memory: u64,
    /// Where the workers announce their call writes to the event loop's watchdog.
    pub(crate) calls: Arc<reactor::CallSlots>,
    /// Called when a ring starts or the port's [`WakeFds`] are made
    /// ([`Reactor::on_ring_start`]).
    pub(crate) ring_start: Arc<reactor::RingStartHook>,
}

/// What wakes a worker sleeping on a port's queues: per pair an epoll instance holding the
/// transmitq's current kick fd (a stable fd the worker registers once), and the eventfd of
/// injected frames in pair 0's. `pairs + 1` descriptors, made when a frontend first
/// connects.
#[derive(Debug)]
pub(crate) struct WakeFds {
    pub(crate) kicks: Box<[Epoll]>,
    /// In pair 0's kick epoll: wakes the worker polling queue 0 for an injected frame.
    pub(crate) inject: EventFd,
}

impl WakeFds {
    fn new(pairs: u16) -> std::io::Result<WakeFds> {
        let kicks: Box<[Epoll]> = (0..pairs.max(1))
            .map(|_| Epoll::new())
            .collect::<std::io::Result<_>>()?;
        let inject = EventFd::new()?;
        kicks[0].add(inject.as_raw_fd(), INJECT_TOKEN)?;
        Ok(WakeFds { kicks, inject })
    }

    /// Takes kick fd `fd` of pair `q` out of its epoll.
    pub(crate) fn forget_kick(&self, q: usize, fd: RawFd) {
        if let Some(p) = self.kicks.get(q) {
            let _ = p.delete(fd);
        }
    }
}

impl VhostState {
    fn new(name: &str, pairs: u16, reactor: &Reactor) -> VhostState {
        VhostState {
            name: name.to_string(),
            pairs,
            mem: GuestMemoryAtomic::new(GuestMem::new()),
            vrings: (0..pairs * 2).map(|_| Mutex::new(Vring::new())).collect(),
            wake: std::sync::OnceLock::new(),
            kicks_muted: AtomicU32::new(0),
            features: AtomicU64::new(0),
            rx_enabled: AtomicU32::new(0),
            reta: ArcSwap::from_pointee(Reta::new(&[])),
            rss: Toeplitz::default(),
            connected: AtomicBool::new(false),
            guest_errors: AtomicU64::new(0),
            log: ArcSwapOption::empty(),
            logging: AtomicBool::new(false),
            logged_pages: AtomicU64::new(0),
            log_missed: AtomicU64::new(0),
            rarps: AtomicU64::new(0),
            inject: Mutex::new(Vec::new()),
            inject_pending: AtomicBool::new(false),
            max_guest_memory: reactor.settings().max_guest_memory,
            calls: reactor.calls(),
            ring_start: reactor.ring_start_hook(),
        }
    }

    /// The port's wake-up fds, made on first use (a frontend's connection, see
    /// `Reactor::connected`): an idle port holds none. Making them calls the ring-start hook,
    /// which flags and wakes the workers so that each registers the new kick epoll before it
    /// next sleeps. A kick that comes before that registration is not lost: the kick epoll
    /// and the worker's epoll are level-triggered, so a kick fd still unread makes the kick
    /// epoll readable when the worker adds it.
    pub(crate) fn wake_fds(&self) -> std::io::Result<&WakeFds> {
        if let Some(w) = self.wake.get() {
            return Ok(w);
        }
        let made = WakeFds::new(self.pairs)?;
        let fresh = std::cell::Cell::new(false);
        let w = self.wake.get_or_init(|| {
            fresh.set(true);
            made
        });
        if fresh.get() {
            self.ring_start.call();
        }
        Ok(w)
    }

    /// Takes ring `vi`'s kick fd `fd` out of its pair's epoll (transmit rings only).
    pub(crate) fn forget_kick(&self, vi: usize, fd: RawFd) {
        if vi % 2 == 1 {
            if let Some(w) = self.wake.get() {
                w.forget_kick(vi / 2, fd);
            }
        }
    }

    /// The dirty log while logging is on: one relaxed load when it is off (once per burst).
    #[inline(always)]
    pub(crate) fn dirty_log(&self) -> Option<Arc<DirtyLog>> {
        if self.logging.load(Ordering::Relaxed) {
            self.log.load_full()
        } else {
            None
        }
    }

    /// Turns logging on when LOG_ALL is negotiated and a log is mapped, off otherwise.
    pub(crate) fn update_logging(&self) {
        let on =
            self.features.load(Ordering::Relaxed) & F_LOG_ALL != 0 && self.log.load().is_some();
        let was = self.logging.swap(on, Ordering::AcqRel);
        if was != on {
            tracing::info!(port = %self.name, on, "dirty-page logging");
        }
    }

    /// Marks the used ring's flags and `avail_event` (written by virtio-queue's
    /// notification toggles) in the dirty log.
    pub(crate) fn log_used_meta(&self, v: &Vring) {
        if let Some(log) = self.dirty_log() {
            let used = v.queue.used_ring();
            let size = u64::from(v.queue.size());
            mem::log_write(&log, self, used, 4);
            mem::log_write(&log, self, used + 4 + 8 * size, 2);
        }
    }

    /// Queues a RARP from `mac` as if the guest had sent it (VHOST_USER_SEND_RARP after a
    /// migration): the switch learns `mac` on this port at once.
    pub(crate) fn inject_rarp(&self, mac: [u8; 6]) {
        let mut f = [0u8; 60];
        f[..6].fill(0xff);
        f[6..12].copy_from_slice(&mac);
        f[12..14].copy_from_slice(&0x8035u16.to_be_bytes());
        // htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4, op 3 (reverse request).
        f[14..22].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 3]);
        f[22..28].copy_from_slice(&mac);
        f[32..38].copy_from_slice(&mac);
        {
            let mut q = self.inject.lock();
            if q.len() < 8 {
                q.push(f);
            }
        }
        self.inject_pending.store(true, Ordering::Release);
        self.rarps.fetch_add(1, Ordering::Relaxed);
        match self.wake_fds() {
            Ok(w) => {
                let _ = w.inject.notify();
            }
            // The frame waits for the worker's next poll of queue 0.
            Err(e) => {
                tracing::warn!(port = %self.name, error = %e, "cannot wake a worker for a RARP")
            }
        }
    }

    /// Moves queued injected frames into `pkts`; returns how many.
    fn take_injected(&self, pkts: &mut [Pkt]) -> usize {
        if let Some(w) = self.wake.get() {
            let _ = w.inject.drain();
        }
        let mut q = self.inject.lock();
        let n = q.len().min(pkts.len());
        for (pkt, f) in pkts.iter_mut().zip(q.drain(..n)) {
            pkt.fill(&f);
        }
        self.inject_pending.store(!q.is_empty(), Ordering::Release);
        n
    }

    pub(crate) fn has(&self, bit: u32) -> bool {
        self.features.load(Ordering::Relaxed) & (1u64 << bit) != 0
    }

    /// Records whether ring `vi` is usable; call with the ring locked after changing it.
    pub(crate) fn note_ring(&self, vi: usize, v: &Vring) {
        if vi.is_multiple_of(2) {
            let bit = 1u32 << (vi / 2);
            let old = if v.usable() {
                self.rx_enabled.fetch_or(bit, Ordering::AcqRel)
            } else {
                self.rx_enabled.fetch_and(!bit, Ordering::AcqRel)
            };
            self.update_reta(old);
        }
    }

    /// Length of the virtio-net header the guest uses.
    pub(crate) fn hdr_len(&self) -> usize {
        if self.has(VIRTIO_F_VERSION_1) || self.has(VIRTIO_NET_F_MRG_RXBUF) {
            12
        } else {
            10
        }
    }

    /// Whether a region of the guest memory faulted (`SIGBUS`; it reads as zeros now).
    pub(crate) fn mem_faulted(&self) -> bool {
        self.mem.memory().iter().any(|r| r.bitmap().faulted())
    }

    /// Puts the kick fds muted for a kick storm back into their epoll instances.
    pub(crate) fn unmute_kicks(&self) {
        let muted = self.kicks_muted.swap(0, Ordering::AcqRel);
        let Some(w) = self.wake.get() else {
            return;
        };
        for q in (0..self.pairs).filter(|q| muted & (1 << q) != 0) {
            let v = self.vrings[usize::from(q) * 2 + 1].lock();
            if let Some(k) = &v.kick {
                let _ = w.kicks[usize::from(q)].add(k.as_raw_fd(), 0);
            }
        }
    }

    /// Stops every ring as broken (the guest has to set them up again).
    pub(crate) fn stop_rings(&self, why: &str) {
        for (i, v) in self.vrings.iter().enumerate() {
            let mut v = v.lock();
            if v.started && !v.broken {
                v.broken = true;
                self.guest_error(why, i, true);
                self.note_ring(i, &v);
            }
        }
    }

    /// The frontend went away: stop every ring and unmap the guest memory.
    pub(crate) fn disconnect(&self) {
        self.features.store(0, Ordering::Relaxed);
        for (i, v) in self.vrings.iter().enumerate() {
            let mut v = v.lock();
            if let Some(k) = v.kick.take() {
                self.forget_kick(i, k.as_raw_fd());
            }
            *v = Vring::new();
        }
        self.kicks_muted.store(0, Ordering::Release);
        self.logging.store(false, Ordering::Release);
        self.log.store(None);
        let old = self.rx_enabled.swap(0, Ordering::AcqRel);
        self.update_reta(old);
        // Last: whoever sees the port disconnected sees its rings disabled too.
        self.connected.store(false, Ordering::Release);
        // Workers in the middle of a burst keep the old table alive until they finish.
        if let Ok(m) = self.mem.lock() {
            m.replace(GuestMem::new());
        }
    }

    /// Rebuilds the indirection table if the usable receive queues changed from `old`.
    fn update_reta(&self, old: u32) {
        let now = self.rx_enabled.load(Ordering::Acquire);
        if now != old {
            let queues: Vec<u16> = (0..32).filter(|k| now & (1 << k) != 0).collect();
            self.reta.store(Arc::new(Reta::new(&queues)));
        }
    }

    /// The current indirection table.
    pub(crate) fn reta(&self) -> Arc<Reta> {
        self.reta.load_full()
    }

    pub(crate) fn guest_error(&self, what: &str, vring: usize, first: bool) {
        self.guest_errors.fetch_add(1, Ordering::Relaxed);
        if first {
            tracing::warn!(port = %self.name, vring, "guest error: {what}");
        }
    }
}

/// A vhost-user port. Its control plane (listening, connecting, the protocol) runs in the
/// shared [`Reactor`]; its data path in the workers.
pub struct VhostUserPort {
    dev: Arc<VhostState>,
    socket: PathBuf,
    mode: Mode,
    id: u64,
    reactor: Reactor,
    /// Server mode: (device, inode) of the socket file this port bound; only that file is
    /// removed when the port goes.
    bound: Option<(u64, u64)>,
}

impl std::fmt::Debug for VhostUserPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserPort")
            .field("socket", &self.socket)
            .field("mode", &self.mode)
            .finish()
    }
}

/// Errors creating a vhost-user port.
#[derive(Debug, thiserror::Error)]
pub enum VhostUserError {
    #[error("cannot listen on {path}")]
    Listen {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the port")]
    Setup(#[source] std::io::Error),
}

impl VhostUserPort {
    /// Creates the port and hands it to `reactor`. In server mode the socket is bound now
    /// (a stale socket file is replaced); in client mode the reactor connects in the
    /// background and keeps reconnecting.
    pub fn new(
        name: &str,
        socket: &Path,
        mode: Mode,
        pairs: u16,
        reactor: &Reactor,
    ) -> Result<VhostUserPort, VhostUserError> {
        let dev = Arc::new(VhostState::new(name, pairs.clamp(1, MAX_PAIRS), reactor));
        let (listener, bound) = match mode {
            Mode::Server => {
                let (l, bound) =
                    listen(socket, reactor.settings().socket_group).map_err(|source| {
                        VhostUserError::Listen {
                            path: socket.display().to_string(),
                            source,
                        }
                    })?;
                (Some(l), Some(bound))
            }
            Mode::Client => (None, None),
        };
        let id = reactor.next_id();
        reactor.add(reactor::PortSetup {
            id,
            dev: dev.clone(),
            socket: socket.to_path_buf(),
            listener,
        });
        Ok(VhostUserPort {
            dev,
            socket: socket.to_path_buf(),
            mode,
            id,
            reactor: reactor.clone(),
            bound,
        })
    }

    /// Negotiated virtio features (0 while no frontend is connected).
    pub fn features(&self) -> u64 {
        self.dev.features.load(Ordering::Relaxed)
    }

    /// Whether a frontend is connected.
    pub fn connected(&self) -> bool {
        self.dev.connected.load(Ordering::Relaxed)
    }

    /// Queue pairs whose receive ring the guest has enabled. Reads an atomic: never waits
    /// for a ring lock (the control plane calls this under its own lock).
    pub fn enabled_pairs(&self) -> Vec<u16> {
        let bits = self.dev.rx_enabled.load(Ordering::Acquire);
        (0..self.dev.pairs)
            .filter(|&p| bits & (1 << p) != 0)
            .collect()
    }

    /// The receive-side indirection table (vRSS) over the enabled queue pairs.
    pub fn reta(&self) -> Arc<Reta> {
        self.dev.reta()
    }

    /// Guest errors seen so far.
    pub fn guest_errors(&self) -> u64 {
        self.dev.guest_errors.load(Ordering::Relaxed)
    }

    /// Whether dirty-page logging (live migration) is on.
    pub fn dirty_logging(&self) -> bool {
        self.dev.logging.load(Ordering::Relaxed)
    }

    /// Page marks made in the dirty log so far.
    pub fn logged_pages(&self) -> u64 {
        self.dev.logged_pages.load(Ordering::Relaxed)
    }

    /// RARP announcements injected (VHOST_USER_SEND_RARP) so far.
    pub fn announces(&self) -> u64 {
        self.dev.rarps.load(Ordering::Relaxed)
    }
}

/// Binds a non-blocking listener on `socket`, replacing a stale socket file (one nobody
/// listens on); a live socket is another service's and is left alone (`AddrInUse`). The
/// socket is mode 0660 whatever the umask (created under a 0177 umask, so never more open
/// than 0600 before the chmod), in group `gid` if given ([`Settings::socket_group`]).
/// Returns the listener and the bound file's (device, inode).
fn listen(socket: &Path, gid: Option<u32>) -> std::io::Result<(UnixListener, (u64, u64))> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
        if UnixStream::connect(socket).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "a live socket is already there (another service's); refusing to replace it",
            ));
        }
        std::fs::remove_file(socket)?;
    }
    let old = qswitch_sys::thread::set_umask(0o177);
    let bound = UnixListener::bind(socket);
    qswitch_sys::thread::set_umask(old);
    let l = bound?;
    let placed = (|| {
        if let Some(gid) = gid {
            std::os::unix::fs::chown(socket, None, Some(gid))?;
        }
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))
    })();
    if let Err(e) = placed {
        let _ = std::fs::remove_file(socket);
        return Err(e);
    }
    l.set_nonblocking(true)?;
    let m = std::fs::symlink_metadata(socket)?;
    Ok((l, (m.dev(), m.ino())))
}

impl Drop for VhostUserPort {
    fn drop(&mut self) {
        self.reactor.remove(self.id);
        self.dev.disconnect();
        // Only the file this port bound: never one that replaced it since.
        use std::os::unix::fs::MetadataExt;
        let ours = std::fs::symlink_metadata(&self.socket)
            .is_ok_and(|m| self.bound == Some((m.dev(), m.ino())));
        if self.mode == Mode::Server && ours {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

/// Token of the injected-frame wake-up in pair 0's kick epoll (the kick fds use 0).
const INJECT_TOKEN: u64 = 1;

/// `VHOST_USER_SEND_RARP`.
const SEND_RARP: u32 = FrontendReq::SEND_RARP as u32;

/// If the next message waiting on the socket is SEND_RARP, the MAC it carries.
pub(crate) fn peek_send_rarp(stream: &UnixStream) -> Option<[u8; 6]> {
    // Header (12 bytes), then a u64 whose first 6 bytes are the MAC.
    let mut b = [0u8; 20];
    let n = qswitch_sys::fd::peek(stream, &mut b).ok()?;
    let word = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (n == b.len() && word(0) == SEND_RARP && word(8) == 8).then(|| {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&b[12..18]);
        mac
    })
}

/// `VHOST_USER_SET_VRING_ENABLE`.
const SET_VRING_ENABLE: u32 = FrontendReq::SET_VRING_ENABLE as u32;

/// If the next message waiting on the socket is SET_VRING_ENABLE, its (vring, enable).
pub(crate) fn peek_vring_enable(stream: &UnixStream) -> Option<(u32, bool)> {
    // Header: request, flags, size (u32 each, native order); body: vring index, num.
    let mut b = [0u8; 20];
    let n = qswitch_sys::fd::peek(stream, &mut b).ok()?;
    let word = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (n == b.len() && word(0) == SET_VRING_ENABLE && word(8) == 8).then(|| (word(12), word(16) == 1))
}

impl Port for VhostUserPort {
    // Not inlined (one call per burst of 32): bench/callgrind.sh counts instructions per frame
    // from these two functions' inclusive cost.
    #[inline(never)]
    fn rx_burst(&self, queue: u16, pkts: &mut [Pkt], _now: u64, drops: &mut DropTally) -> usize {
        if queue == 0 && self.dev.inject_pending.load(Ordering::Relaxed) {
            let n = self.dev.take_injected(pkts);
            return n + rings::rx_burst(&self.dev, queue, &mut pkts[n..], drops);
        }
        // No frontend: no ring is usable, so the ring's lock and lines stay untouched (a
        // worker owning thousands of idle ports polls them all at each wake-up).
        if !self.dev.connected.load(Ordering::Acquire) {
            return 0;
        }
        rings::rx_burst(&self.dev, queue, pkts, drops)
    }

    #[inline(never)]
    fn tx_burst(
        &self,
        _worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        drops: &mut DropTally,
    ) -> TxDone {
        rings::tx_burst(&self.dev, pkts, sel, drops)
    }

    fn rx_fd(&self, queue: u16) -> Option<RawFd> {
        // None until a frontend first connects (see `VhostState::wake_fds`).
        self.dev
            .wake
            .get()?
            .kicks
            .get(usize::from(queue))
            .map(AsRawFd::as_raw_fd)
    }

    fn rx_arm(&self, queue: u16) -> bool {
        // No frontend: no kick fd and no usable ring to arm (see `rx_burst`); a frame still
        // queued for injection keeps the worker polling until `rx_burst` takes it.
        if !self.dev.connected.load(Ordering::Acquire) {
            return !(queue == 0 && self.dev.inject_pending.load(Ordering::Acquire));
        }
        let ready = rings::arm(&self.dev, queue);
        ready && !(queue == 0 && self.dev.inject_pending.load(Ordering::Acquire))
    }

    fn rx_dormant(&self, queue: u16) -> bool {
        // Woken when a ring starts (`Reactor::on_ring_start`), by a kick, or by a RARP to
        // inject (pair 0's kick epoll).
        let waiting = queue == 0 && self.dev.inject_pending.load(Ordering::Acquire);
        !self.dev.connected.load(Ordering::Acquire) && !waiting
    }

    fn offloads(&self) -> Vec<&'static str> {
        feature_names(self.features())
    }
}
