//! A minimal virtio-net driver that talks vhost-user as the **front-end**: what QEMU plus a
//! guest's virtio-net driver do, in one process, with no VM. For testing and load-generating
//! against a vhost-user net back-end (qswitch's vhost-user ports, DPDK, …). No privileges
//! needed: guest memory is a memfd, notifications are eventfds.
//!
//! ```no_run
//! use std::path::Path;
//! use std::time::Duration;
//! use qswitch_virtio_driver::{Driver, DriverOptions, LoadSpec, NetHdr};
//!
//! # fn main() -> Result<(), qswitch_virtio_driver::Error> {
//! // qswitch in server mode listens on the socket; we connect and negotiate.
//! let mut d = Driver::connect(
//!     Path::new("/run/qswitch/vm1.sock"),
//!     DriverOptions { queue_pairs: 4, ..DriverOptions::default() },
//! )?;
//! println!("features {:#x}, back-end has {} queue pairs", d.features(), d.max_queue_pairs());
//! d.enable_pairs(1)?; // like `ethtool -L eth0 combined 1`
//!
//! let hdr = NetHdr::default().to_bytes(); // 12 bytes: no offloads
//! let frame = [0u8; 60];
//! while !d.send(0, &hdr, &frame)? {} // false: tx ring full, retry
//! let mut pkt = Vec::new();
//! if let Some(len) = d.recv(0, &mut pkt)? {
//!     let h = NetHdr::from_bytes(&pkt).unwrap();
//!     println!("{len} bytes, {} buffers", h.num_buffers);
//! }
//!
//! // Load generation: tx and rx in one loop on one core.
//! let stats = d.poll_loop(&LoadSpec::new(&hdr, &frame, Duration::from_secs(1)))?;
//! println!("{} pps out, {} pps back", stats.tx_pkts, stats.rx_pkts);
//! # Ok(()) }
//! ```
//!
//! # What goes over the socket
//!
//! [`Driver::connect`] / [`Driver::accept`] send, in this order (QEMU's order):
//!
//! 1. `GET_FEATURES`
//! 2. if bit 30 (`PROTOCOL_FEATURES`) is offered and accepted: `GET_PROTOCOL_FEATURES`,
//!    `SET_PROTOCOL_FEATURES` with `offered & options.protocol_features` (default MQ |
//!    REPLY_ACK). From here on, with REPLY_ACK, every message carries `NEED_REPLY` and the
//!    driver waits for the ack (messages that have a reply body get only that reply).
//! 3. if MQ was acked: `GET_QUEUE_NUM` — read as a number of **queue pairs** (QEMU and DPDK
//!    read it that way for net; rust-vmm's `vhost-user-backend` answers with its number of
//!    queues, so it over-reports by 2×).
//! 4. `SET_OWNER`
//! 5. `SET_FEATURES` with `offered & options.features`, minus [`features::UNSUPPORTED`], with
//!    dependencies fixed (no TSO without the matching CSUM). MQ does not need the back-end
//!    to offer CTRL_VQ: the control queue is the front-end's.
//! 6. `SET_MEM_TABLE`: one region, guest physical address 0, size `mem_size`, user address =
//!    this process's mapping, mmap offset 0, the memfd.
//! 7. for each vring 0..2·queue_pairs in order: `SET_VRING_NUM` (queue_size),
//!    `SET_VRING_BASE` (0), `SET_VRING_ADDR` (user addresses, flags 0), `SET_VRING_KICK`,
//!    `SET_VRING_CALL` (eventfds). Rx rings already hold `queue_size` posted buffers when
//!    `SET_VRING_ADDR` is sent; the kick is written right after `SET_VRING_CALL` —
//!    **before** the ring is enabled.
//! 8. `SET_VRING_ENABLE` 1 for vrings 0 and 1 and 0 for the others, then, if
//!    `queue_pairs` > 1, `SET_VRING_ENABLE` 1 for every vring (pair 0 first, then what the
//!    guest's `VQ_PAIRS_SET` would enable). Without protocol features, rings are enabled by
//!    `SET_FEATURES` and no `SET_VRING_ENABLE` is sent.
//!
//! The control queue is never given to the back-end (QEMU keeps it too): a queue-pair change
//! is [`Driver::enable_pairs`], i.e. `SET_VRING_ENABLE` messages. Nothing is sent on drop or
//! [`Driver::close`]: the socket just closes (like a killed QEMU). `SET_VRING_ERR`,
//! `GET_VRING_BASE` ([`Driver::get_vring_base`]) and anything else only on request.
//!
//! # Rings and memory
//!
//! Split virtqueues. Guest page 0 is left unused. Per vring, from guest physical address
//! 0x1000, on a page boundary: the descriptor table (16 B × size), the avail ring right
//! behind it, the used ring on the next page boundary. Then per rx vring
//! `queue_size` buffers of `rx_buf_size` bytes and per tx vring `queue_size` slots of
//! `tx_buf_size` bytes (slot strides padded to 64 B + 64 B), then a free scratch area
//! ([`Driver::scratch`]). Rx descriptor `i` always points at rx buffer `i`
//! (device-writable, one descriptor per buffer, no chains); a tx packet (header and frame
//! contiguous) takes one descriptor per `tx_buf_size` bytes, chained with `NEXT`.
//! Indirect descriptors are never used by the driver itself.
//!
//! The receive side checks the device: used ids must be posted buffers, lengths within the
//! buffer, `num_buffers` 1 without `MRG_RXBUF`, and with it all `num_buffers` used entries
//! of a packet must be visible once its first one is (publish the used index once per
//! packet, as QEMU does; Linux drops a packet whose buffers are missing as an
//! `rx_length_error`). A violation is [`Error::Ring`].
//!
//! `examples/loadgen.rs` runs [`poll_loop_between`] between two switch ports:
//! `cargo run --release -p qswitch-virtio-driver --example loadgen -- A.sock B.sock 5 60`.
//!
//! Notifications: the driver kicks per `EVENT_IDX` (`avail_event`) when negotiated, else
//! unless the device set `NO_NOTIFY`. It asks for calls (`used_event` = next used entry, or
//! no `NO_INTERRUPT`) when [`DriverOptions::request_calls`] is set (default) and suppresses
//! them otherwise (benchmarks). It never blocks on the call eventfd: it polls the used
//! rings; [`Driver::calls`] counts what arrived.
//!
//! # Limitations
//! - Split rings only; no packed rings, no indirect descriptors of its own, no IOTLB, no
//!   `HASH_REPORT` (20-byte header), no config space (`GET_CONFIG`), no reconnection,
//!   no dirty logging.
//! - Rx buffers are single descriptors; big-packet mode (no `MRG_RXBUF`) needs
//!   `rx_buf_size` ≥ 65562 and the memory for it.
//! - One thread: `Driver` is `Send`, not shared.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod hdr;
mod load;
mod raw;
mod ring;
mod shm;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VringConfigData};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub use hdr::{features, protocol_features, NetHdr};
pub use load::{poll_loop_between, LoadSpec, LoadStats};
pub use raw::RawVring;
pub use ring::{
    AVAIL_F_NO_INTERRUPT, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, USED_F_NO_NOTIFY,
};
pub use vhost;
pub use vm_memory;
pub use vm_memory::GuestMemoryMmap;

use ring::{align_up, Layout, Vring, PAGE};
use shm::Shm;

/// Errors of the driver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed (socket, eventfd, memfd).
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A vhost-user request failed or the back-end answered badly (or not in time).
    #[error("vhost-user: {0}")]
    Vhost(#[from] vhost::Error),
    /// Guest memory could not be created or accessed.
    #[error("guest memory: {0}")]
    Memory(String),
    /// Guest memory access out of range.
    #[error("guest memory access: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    /// The caller asked for something impossible.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The back-end cannot do what the options require.
    #[error("back-end: {0}")]
    Backend(String),
    /// The device broke the virtqueue protocol (bad used id/len, missing merge buffers…).
    #[error("vring {vring}: device protocol violation: {what}")]
    Ring {
        /// The vring.
        vring: u16,
        /// What was wrong.
        what: String,
    },
    /// Nothing happened in time.
    #[error("timed out: {0}")]
    Timeout(String),
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// How to set the device up. Use `..DriverOptions::default()` for the rest.
#[derive(Clone, Debug)]
pub struct DriverOptions {
    /// Queue pairs to set up (vrings 0..2·queue_pairs). All are enabled after negotiation;
    /// the back-end must support them (`GET_QUEUE_NUM`, read as pairs).
    pub queue_pairs: u16,
    /// Entries per vring (power of two, ≤ 32768). Default 256.
    pub queue_size: u16,
    /// Guest memory size (rounded up to 4 KiB). Default 64 MiB.
    pub mem_size: usize,
    /// Virtio feature bits to accept if offered (including vhost-user bit 30,
    /// `PROTOCOL_FEATURES`). Default [`features::DEFAULT`].
    pub features: u64,
    /// vhost-user protocol features to request if offered. Default
    /// [`protocol_features::DEFAULT`] (MQ | REPLY_ACK).
    pub protocol_features: u64,
    /// Size of each posted rx buffer (one descriptor each). Default 2048; 65562 for
    /// "big packets" without `MRG_RXBUF`.
    pub rx_buf_size: usize,
    /// Size of each tx buffer slot; larger packets are chained over several. Default 2048.
    pub tx_buf_size: usize,
    /// Ask the device for calls (interrupts) as an idle guest would. Default true;
    /// benchmarks turn it off so the back-end does not write eventfds.
    pub request_calls: bool,
    /// How long to wait for any vhost-user reply (socket read timeout). Default 5 s.
    pub reply_timeout: Duration,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            queue_pairs: 1,
            queue_size: 256,
            mem_size: 64 << 20,
            features: features::DEFAULT,
            protocol_features: protocol_features::DEFAULT,
            rx_buf_size: 2048,
            tx_buf_size: 2048,
            request_calls: true,
            reply_timeout: Duration::from_secs(5),
        }
    }
}

/// How long [`Driver::connect`] retries while the socket does not exist or refuses.
pub const CONNECT_RETRY: Duration = Duration::from_secs(2);

const VHOST_USER_GET_QUEUE_NUM: u32 = 17;
const VHOST_USER_VERSION: u32 = 1;
const VHOST_USER_REPLY: u32 = 1 << 2;

/// A connected, negotiated virtio-net device. See the crate docs.
pub struct Driver {
    frontend: Frontend,
    sock: UnixStream,
    shm: Shm,
    vrings: Vec<Vring>,
    opts: DriverOptions,
    offered: u64,
    features: u64,
    offered_protocol: u64,
    protocol_features: u64,
    queue_num: Option<u64>,
    hdr_len: usize,
    mrg: bool,
    enabled_pairs: u16,
    scratch: (u64, u64),
}

impl Driver {
    /// Connect to a back-end listening on `path` (qswitch in server mode) and negotiate.
    /// Retries for up to [`CONNECT_RETRY`] while the socket is missing or refuses.
    pub fn connect(path: &Path, opts: DriverOptions) -> Result<Driver> {
        Plan::new(&opts)?;
        let deadline = Instant::now() + CONNECT_RETRY;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e.into()),
            }
        };
        Self::setup(stream, opts)
    }

    /// Listen on `path` (a stale file there is removed), accept one back-end connection
    /// within `timeout` (qswitch in client mode), remove the socket file and negotiate.
    pub fn accept(path: &Path, opts: DriverOptions, timeout: Duration) -> Result<Driver> {
        Plan::new(&opts)?;
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + timeout;
        let res = loop {
            match listener.accept() {
                Ok((s, _)) => break Ok(s),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        break Err(Error::Timeout(format!(
                            "no back-end connected to {} within {timeout:?}",
                            path.display()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => break Err(e.into()),
            }
        };
        let _ = std::fs::remove_file(path);
        let stream = res?;
        stream.set_nonblocking(false)?;
        Self::setup(stream, opts)
    }

    fn setup(stream: UnixStream, opts: DriverOptions) -> Result<Driver> {
        let Plan {
            layouts,
            bufs,
            mem_size,
            scratch,
        } = Plan::new(&opts)?;
        let q = opts.queue_size;
        let nvr = 2 * opts.queue_pairs;
        let shm = Shm::new(mem_size as usize)?;

        stream.set_read_timeout(Some(opts.reply_timeout))?;
        stream.set_write_timeout(Some(opts.reply_timeout))?;
        let mut sock = stream.try_clone()?;
        // The Frontend checks vring indices against this; we keep our own checks.
        let mut fe =
            Frontend::from_stream(stream, vhost::vhost_user::message::VHOST_USER_MAX_VRINGS);

        // 1. Features offered.
        let offered = fe.get_features()?;
        let acked = features::fix_dependencies(offered & opts.features & !features::UNSUPPORTED);

        // 2. Protocol features.
        let mut proto = 0u64;
        let mut offered_protocol = 0u64;
        if acked & features::PROTOCOL_FEATURES != 0 {
            offered_protocol = fe.get_protocol_features()?.bits();
            proto = offered_protocol & opts.protocol_features;
            fe.set_protocol_features(VhostUserProtocolFeatures::from_bits_truncate(proto))?;
            if proto & protocol_features::REPLY_ACK != 0 {
                fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
            }
        }

        // 3. Queue pairs.
        let mut queue_num = None;
        let max_pairs = if proto & protocol_features::MQ != 0 {
            let n = raw_get_queue_num(&mut sock)?;
            queue_num = Some(n);
            n.min(u64::from(u16::MAX)) as u16
        } else {
            1
        };
        if opts.queue_pairs > max_pairs {
            return Err(Error::Backend(format!(
                "{} queue pairs requested, back-end supports {max_pairs}{}",
                opts.queue_pairs,
                if queue_num.is_none() {
                    " (no vhost-user MQ protocol feature)"
                } else {
                    ""
                }
            )));
        }
        // 4. Owner, 5. features.
        fe.set_owner()?;
        fe.set_features(acked)?;
        let event_idx = acked & features::EVENT_IDX != 0;
        let mrg = acked & features::MRG_RXBUF != 0;
        let hdr_len = if acked & (features::VERSION_1 | features::MRG_RXBUF) != 0 {
            NetHdr::LEN
        } else {
            NetHdr::LEGACY_LEN
        };

        // 6. Memory.
        fe.set_mem_table(&[shm.region_info()?])?;

        // 7. Vrings.
        let mut vrings = Vec::with_capacity(usize::from(nvr));
        for v in 0..nvr {
            let l = layouts[usize::from(v)];
            let (base, stride) = bufs[usize::from(v)];
            let len = if v & 1 == 0 {
                opts.rx_buf_size
            } else {
                opts.tx_buf_size
            } as u32;
            let mut vr = Vring::new(v, l, base, stride, len, event_idx, opts.request_calls)?;
            if acked & features::IN_ORDER != 0 {
                vr.in_order = Some(std::collections::VecDeque::new());
            }
            vr.init(&shm)?;
            let vi = usize::from(v);
            fe.set_vring_num(vi, q)?;
            fe.set_vring_base(vi, 0)?;
            fe.set_vring_addr(
                vi,
                &VringConfigData {
                    queue_max_size: q,
                    queue_size: q,
                    flags: 0,
                    desc_table_addr: shm.user_addr(l.desc),
                    used_ring_addr: shm.user_addr(l.used),
                    avail_ring_addr: shm.user_addr(l.avail),
                    log_addr: None,
                },
            )?;
            fe.set_vring_kick(vi, &vr.kick)?;
            fe.set_vring_call(vi, &vr.call)?;
            if vr.is_rx() {
                // A guest kicks after filling its rx ring, whether or not the pair is
                // enabled yet.
                vr.do_kick()?;
            }
            vrings.push(vr);
        }

        let mut d = Driver {
            frontend: fe,
            sock,
            shm,
            vrings,
            offered,
            features: acked,
            offered_protocol,
            protocol_features: proto,
            queue_num,
            hdr_len,
            mrg,
            enabled_pairs: 0,
            scratch,
            opts,
        };

        // 8. Enable: pair 0 first (others explicitly disabled), then all requested pairs.
        if d.features & features::PROTOCOL_FEATURES != 0 {
            d.enable_pairs(1)?;
            if d.opts.queue_pairs > 1 {
                d.enable_pairs(d.opts.queue_pairs)?;
            }
        } else {
            d.enabled_pairs = d.opts.queue_pairs;
        }
        Ok(d)
    }

    /// Virtio features the back-end offered (`GET_FEATURES`).
    pub fn offered_features(&self) -> u64 {
        self.offered
    }

    /// Protocol features the back-end offered (`GET_PROTOCOL_FEATURES`, bits known to the
    /// `vhost` crate; 0 if not asked).
    pub fn offered_protocol_features(&self) -> u64 {
        self.offered_protocol
    }

    /// Negotiated virtio features (what `SET_FEATURES` sent).
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Negotiated vhost-user protocol features (what `SET_PROTOCOL_FEATURES` sent; 0 if none).
    pub fn protocol_features(&self) -> u64 {
        self.protocol_features
    }

    /// Queue pairs the back-end supports: `GET_QUEUE_NUM`'s answer read as pairs, or 1
    /// without the MQ protocol feature.
    pub fn max_queue_pairs(&self) -> u16 {
        self.queue_num
            .map_or(1, |n| n.min(u64::from(u16::MAX)) as u16)
    }

    /// `GET_QUEUE_NUM`'s raw answer (None without the MQ protocol feature).
    pub fn queue_num(&self) -> Option<u64> {
        self.queue_num
    }

    /// Queue pairs set up ([`DriverOptions::queue_pairs`]).
    pub fn queue_pairs(&self) -> u16 {
        self.opts.queue_pairs
    }

    /// Queue pairs currently enabled.
    pub fn enabled_pairs(&self) -> u16 {
        self.enabled_pairs
    }

    /// Entries per vring.
    pub fn queue_size(&self) -> u16 {
        self.opts.queue_size
    }

    /// The virtio-net header size in use: 12 with `VERSION_1` or `MRG_RXBUF`, else 10.
    pub fn hdr_len(&self) -> usize {
        self.hdr_len
    }

    /// The options the driver was created with.
    pub fn options(&self) -> &DriverOptions {
        &self.opts
    }

    /// `SET_VRING_ENABLE` 1 for the vrings of pairs < `n` and 0 for the rest, like
    /// `ethtool -L eth0 combined n`. No kick is sent (rx buffers stay posted, as in Linux).
    /// `n` may be 0 (everything disabled). Without protocol features rings cannot be
    /// disabled and only `n == queue_pairs` is accepted.
    pub fn enable_pairs(&mut self, n: u16) -> Result<()> {
        if n > self.opts.queue_pairs {
            return Err(Error::InvalidArgument(format!(
                "{n} pairs requested, {} set up",
                self.opts.queue_pairs
            )));
        }
        if self.features & features::PROTOCOL_FEATURES == 0 {
            if n == self.opts.queue_pairs {
                return Ok(());
            }
            return Err(Error::Backend(
                "no vhost-user protocol features: rings cannot be enabled one by one".into(),
            ));
        }
        for p in 0..self.opts.queue_pairs {
            let en = p < n;
            for v in [2 * p, 2 * p + 1] {
                self.frontend.set_vring_enable(usize::from(v), en)?;
            }
        }
        self.enabled_pairs = n;
        Ok(())
    }

    fn vring_mut(&mut self, v: usize) -> Result<&mut Vring> {
        let n = self.vrings.len();
        self.vrings
            .get_mut(v)
            .ok_or_else(|| Error::InvalidArgument(format!("vring {v} not set up ({n} vrings)")))
    }

    fn pair_index(&self, pair: u16) -> Result<usize> {
        if pair >= self.opts.queue_pairs {
            return Err(Error::InvalidArgument(format!(
                "pair {pair} not set up ({} pairs)",
                self.opts.queue_pairs
            )));
        }
        Ok(2 * usize::from(pair))
    }

    /// Transmit one packet on `pair`: `hdr` (normally [`Driver::hdr_len`] bytes of
    /// [`NetHdr`]) followed by `frame`, as one descriptor chain. Reclaims used tx
    /// descriptors first; returns false (nothing queued) when the tx ring has no room.
    /// Kicks per EVENT_IDX / `NO_NOTIFY`.
    pub fn send(&mut self, pair: u16, hdr: &[u8], frame: &[u8]) -> Result<bool> {
        Ok(self.send_burst(pair, hdr, frame, 1)? == 1)
    }

    /// Queue up to `n` copies of `hdr` ++ `frame` on `pair` and publish them with one index
    /// update (and at most one kick). Returns how many were queued (fewer when the ring
    /// filled up).
    pub fn send_burst(&mut self, pair: u16, hdr: &[u8], frame: &[u8], n: usize) -> Result<usize> {
        let v = self.pair_index(pair)? + 1;
        let shm = &self.shm;
        let vr = &mut self.vrings[v];
        vr.reclaim_tx(shm)?;
        let mut sent = 0;
        while sent < n && vr.enqueue_tx(shm, hdr, frame)? {
            sent += 1;
        }
        vr.publish(shm)?;
        Ok(sent)
    }

    /// Reclaim completed tx descriptors on `pair` and return how many packets are still
    /// in flight (not yet marked used by the device).
    pub fn tx_in_flight(&mut self, pair: u16) -> Result<usize> {
        let v = self.pair_index(pair)? + 1;
        let shm = &self.shm;
        let vr = &mut self.vrings[v];
        vr.reclaim_tx(shm)?;
        Ok(vr.chain_len.iter().filter(|&&c| c > 0).count())
    }

    /// Receive one packet from `pair` into `out` (cleared first): the virtio-net header
    /// followed by the frame, with `MRG_RXBUF` buffers merged (`num_buffers` from the
    /// header). The buffers are posted again at once. Returns the packet's length, or None
    /// when nothing is pending.
    ///
    /// Checks the device: used ids must be posted buffers, lengths within the buffer and at
    /// least a header, `num_buffers` ≥ 1 (exactly 1 without `MRG_RXBUF`) and all of them
    /// used; violations are [`Error::Ring`] (the buffers seen are reposted first).
    pub fn recv(&mut self, pair: u16, out: &mut Vec<u8>) -> Result<Option<usize>> {
        let v = self.pair_index(pair)?;
        out.clear();
        let (mrg, hdr_len) = (self.mrg, self.hdr_len);
        let shm = &self.shm;
        let vr = &mut self.vrings[v];
        let n = vr.pending_used(shm)?;
        if n == 0 {
            return Ok(None);
        }
        let res = rx_take(vr, shm, mrg, hdr_len, n, Some(out));
        vr.publish(shm)?;
        if vr.request_calls {
            vr.set_call_wish(shm, Ordering::Release)?;
        }
        res.map(|(_, bytes)| Some(bytes))
    }

    /// Receive and drop up to `max` packets from `pair` without copying them (only the
    /// header's `num_buffers` is read), reposting the buffers with one index update.
    /// Returns (packets, bytes including headers).
    pub fn recv_discard(&mut self, pair: u16, max: usize) -> Result<(u64, u64)> {
        let v = self.pair_index(pair)?;
        let (mrg, hdr_len) = (self.mrg, self.hdr_len);
        let shm = &self.shm;
        let vr = &mut self.vrings[v];
        let (mut pkts, mut bytes) = (0u64, 0u64);
        let mut n = vr.pending_used(shm)?;
        let mut res = Ok(());
        while (pkts as usize) < max && n > 0 {
            match rx_take(vr, shm, mrg, hdr_len, n, None) {
                Ok((used, b)) => {
                    pkts += 1;
                    bytes += b as u64;
                    n = n.saturating_sub(used);
                    if n == 0 {
                        n = vr.pending_used(shm)?;
                    }
                }
                Err(e) => {
                    res = Err(e);
                    break;
                }
            }
        }
        if pkts > 0 || res.is_err() {
            vr.publish(shm)?;
            if vr.request_calls {
                vr.set_call_wish(shm, Ordering::Release)?;
            }
        }
        res.map(|()| (pkts, bytes))
    }

    /// Calls (call-eventfd signals) received so far on `vring` (drains the eventfd,
    /// non-blocking).
    pub fn calls(&mut self, vring: u16) -> Result<u64> {
        Ok(self.vring_mut(usize::from(vring))?.drain_calls())
    }

    /// Kicks written so far on `vring`.
    pub fn kicks(&self, vring: u16) -> Result<u64> {
        self.vrings
            .get(usize::from(vring))
            .map(|v| v.kicks)
            .ok_or_else(|| Error::InvalidArgument(format!("vring {vring} not set up")))
    }

    /// Write 1 to `vring`'s kick eventfd.
    pub fn kick(&mut self, vring: u16) -> Result<()> {
        self.vring_mut(usize::from(vring))?.do_kick()
    }

    /// Raw access to `vring`'s memory for hostile-guest tests. Panics if `vring` was not
    /// set up (`vring` < 2·queue_pairs).
    pub fn raw(&mut self, vring: u16) -> RawVring<'_> {
        assert!(
            usize::from(vring) < self.vrings.len(),
            "vring {vring} not set up ({} vrings)",
            self.vrings.len()
        );
        RawVring {
            d: self,
            v: usize::from(vring),
        }
    }

    /// The guest memory (one region at guest physical address 0), e.g. to place indirect
    /// tables or bad buffers (see [`Driver::scratch`]).
    pub fn mem(&self) -> &GuestMemoryMmap {
        self.shm.mem()
    }

    /// Guest memory size in bytes.
    pub fn mem_size(&self) -> u64 {
        self.shm.size()
    }

    /// The unused part of guest memory: (guest physical address, length), page-aligned.
    pub fn scratch(&self) -> (u64, u64) {
        self.scratch
    }

    /// The front-end ("QEMU") virtual address the back-end was told for `gpa`, as used in
    /// `SET_MEM_TABLE` and `SET_VRING_ADDR`.
    pub fn user_addr(&self, gpa: u64) -> u64 {
        self.shm.user_addr(gpa)
    }

    /// The vhost-user `Frontend`, to send any well-formed request (e.g. `SET_VRING_ADDR`
    /// pointing outside memory, `GET_VRING_BASE`, `SET_VRING_ENABLE` by hand).
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.frontend
    }

    /// `GET_VRING_BASE`: stops `vring` in the back-end and returns its next avail index.
    pub fn get_vring_base(&mut self, vring: u16) -> Result<u32> {
        Ok(self.frontend.get_vring_base(usize::from(vring))?)
    }

    /// The vhost-user socket.
    pub fn socket_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Write arbitrary bytes on the vhost-user socket (a malformed message: wrong size,
    /// truncated header, unknown request…). Usually followed by [`Driver::read_raw`] or
    /// [`Driver::close`].
    pub fn send_raw_message(&mut self, bytes: &[u8]) -> Result<()> {
        self.sock.write_all(bytes)?;
        Ok(())
    }

    /// Like [`Driver::send_raw_message`], with file descriptors attached (SCM_RIGHTS) in one
    /// `sendmsg`.
    pub fn send_raw_message_with_fds(&mut self, bytes: &[u8], fds: &[RawFd]) -> Result<()> {
        let n = self
            .sock
            .send_with_fds(&[bytes], fds)
            .map_err(|e| Error::Io(std::io::Error::from_raw_os_error(e.errno())))?;
        if n != bytes.len() {
            self.sock.write_all(&bytes[n..])?;
        }
        Ok(())
    }

    /// Read whatever the back-end sends next (up to 4 KiB), waiting up to `timeout`.
    /// An empty vector means the back-end closed the connection; [`Error::Timeout`] that
    /// nothing came.
    pub fn read_raw(&mut self, timeout: Duration) -> Result<Vec<u8>> {
        self.sock
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        let mut buf = vec![0u8; 4096];
        let r = self.sock.read(&mut buf);
        self.sock.set_read_timeout(Some(self.opts.reply_timeout))?;
        match r {
            Ok(n) => {
                buf.truncate(n);
                Ok(buf)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(Error::Timeout(format!(
                    "nothing from the back-end in {timeout:?}"
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// Close the connection abruptly (shutdown, no `GET_VRING_BASE`), like a killed QEMU.
    /// The guest memory and eventfds are released too.
    pub fn close(self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

/// Where everything goes in guest memory.
struct Plan {
    layouts: Vec<Layout>,
    /// Per vring: (first buffer's address, stride).
    bufs: Vec<(u64, u64)>,
    mem_size: u64,
    scratch: (u64, u64),
}

impl Plan {
    /// Validate the options and lay memory out: rings, then rx buffers / tx slots per
    /// vring, then scratch.
    fn new(opts: &DriverOptions) -> Result<Plan> {
        let q = opts.queue_size;
        if q == 0 || !q.is_power_of_two() || q > 32768 {
            return Err(Error::InvalidArgument(format!(
                "queue_size {q} must be a power of two in 1..=32768"
            )));
        }
        if opts.queue_pairs == 0 || opts.queue_pairs > 128 {
            return Err(Error::InvalidArgument(format!(
                "queue_pairs {} must be in 1..=128",
                opts.queue_pairs
            )));
        }
        if opts.rx_buf_size < NetHdr::LEN || opts.rx_buf_size > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "rx_buf_size {} must be in {}..=u32::MAX",
                opts.rx_buf_size,
                NetHdr::LEN
            )));
        }
        if opts.tx_buf_size < 64 || opts.tx_buf_size > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "tx_buf_size {} must be in 64..=u32::MAX",
                opts.tx_buf_size
            )));
        }

        // Memory plan: rings, then rx buffers, then tx slots, then scratch.
        let nvr = 2 * opts.queue_pairs;
        // Page 0 stays unused, as in a real guest (and a back-end that takes address 0 for
        // "not set" keeps working); hostile tests can still point rings there.
        let mut off = PAGE;
        let mut layouts = Vec::with_capacity(usize::from(nvr));
        for _ in 0..nvr {
            let (l, end) = Layout::at(off, q);
            layouts.push(l);
            off = end;
        }
        let rx_stride = align_up(opts.rx_buf_size as u64, 64) + 64;
        let tx_stride = align_up(opts.tx_buf_size as u64, 64) + 64;
        let mut bufs = Vec::with_capacity(usize::from(nvr));
        for v in 0..nvr {
            let stride = if v & 1 == 0 { rx_stride } else { tx_stride };
            bufs.push((off, stride));
            off = align_up(off + stride * u64::from(q), PAGE);
        }
        let mem_size = align_up(opts.mem_size as u64, PAGE);
        if off > mem_size {
            return Err(Error::InvalidArgument(format!(
                "mem_size {} too small: rings and buffers need {off} bytes",
                opts.mem_size
            )));
        }
        let scratch = (off, mem_size - off);
        Ok(Plan {
            layouts,
            bufs,
            mem_size,
            scratch,
        })
    }
}

/// GET_QUEUE_NUM by hand: the `Frontend` would also reinterpret the answer as its vring
/// limit, which breaks back-ends that (like QEMU and DPDK expect) answer in queue pairs.
fn raw_get_queue_num(sock: &mut UnixStream) -> Result<u64> {
    let mut req = [0u8; 12];
    req[0..4].copy_from_slice(&VHOST_USER_GET_QUEUE_NUM.to_ne_bytes());
    req[4..8].copy_from_slice(&VHOST_USER_VERSION.to_ne_bytes());
    sock.write_all(&req)?;
    let mut rep = [0u8; 20];
    sock.read_exact(&mut rep)?;
    let word = |i: usize| u32::from_ne_bytes(rep[i..i + 4].try_into().expect("4 bytes"));
    let (request, flags, size) = (word(0), word(4), word(8));
    if request != VHOST_USER_GET_QUEUE_NUM || flags & VHOST_USER_REPLY == 0 || size != 8 {
        return Err(Error::Backend(format!(
            "bad GET_QUEUE_NUM reply: request {request}, flags {flags:#x}, size {size}"
        )));
    }
    Ok(u64::from_ne_bytes(rep[12..20].try_into().expect("8 bytes")))
}

/// Take one packet (1..num_buffers used entries) from an rx vring, copying it into `out`
/// if given, and queue its buffers again (not published). Returns (used entries, bytes).
fn rx_take(
    vr: &mut Vring,
    shm: &Shm,
    mrg: bool,
    hdr_len: usize,
    pending: u16,
    mut out: Option<&mut Vec<u8>>,
) -> Result<(u16, usize)> {
    let mut total = 0usize;
    let mut num = 1u16;
    let mut k = 0u16;
    let mut err = None;
    let mut skip_bad = false;
    while k < num {
        if k >= pending {
            // Re-read in case the device is still publishing.
            let now = vr.pending_used(shm)?;
            if k >= now {
                err = Some(vr.violation(format!(
                    "packet announces {num} merged buffers, only {now} used"
                )));
                break;
            }
        }
        let (id, len) = vr.used_elem(shm, k)?;
        let d = match u16::try_from(id) {
            Ok(d) if d < vr.l.size && vr.posted[usize::from(d)] => d,
            _ => {
                err = Some(vr.violation(format!("used id {id} is not a posted rx buffer")));
                skip_bad = true;
                break;
            }
        };
        vr.posted[usize::from(d)] = false;
        k += 1;
        if let Err(e) = vr.check_order(id) {
            err = Some(e);
            break;
        }
        if len > vr.buf_len {
            err = Some(vr.violation(format!(
                "used len {len} larger than the {}-byte buffer {d}",
                vr.buf_len
            )));
            break;
        }
        let addr = vr.buf_addr(d);
        if k == 1 {
            if (len as usize) < hdr_len {
                err = Some(vr.violation(format!(
                    "used len {len} shorter than the {hdr_len}-byte header"
                )));
                break;
            }
            if hdr_len == NetHdr::LEN {
                let nb = shm.load16(addr + 10, Ordering::Relaxed)?;
                if mrg {
                    if nb == 0 {
                        err = Some(vr.violation("num_buffers 0".into()));
                        break;
                    }
                    num = nb;
                } else if nb != 1 {
                    err = Some(
                        vr.violation(format!("num_buffers {nb} without MRG_RXBUF (must be 1)")),
                    );
                    break;
                }
            }
        }
        if let Some(o) = out.as_deref_mut() {
            let at = o.len();
            o.resize(at + len as usize, 0);
            shm.read(addr, &mut o[at..])?;
        }
        total += len as usize;
    }
    // Give back every buffer taken, even on error.
    for j in 0..k {
        let (id, _) = vr.used_elem(shm, j)?;
        let d = id as u16;
        vr.posted[usize::from(d)] = true;
        vr.push_avail(shm, d)?;
    }
    // A used entry with a bad id is stepped over, so the ring can go on.
    let consumed = k + u16::from(skip_bad);
    vr.last_used = vr.last_used.wrapping_add(consumed);
    match err {
        Some(e) => Err(e),
        None => Ok((consumed, total)),
    }
}
