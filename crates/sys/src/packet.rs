//! AF_PACKET: a raw socket bound to one interface, with a `TPACKET_V2` receive ring and
//! batched `sendmmsg` transmission that bypasses the qdisc; and a promiscuous-mode hold
//! that the kernel releases when the process dies.
//!
//! ```text
//!   NIC ──▶ (every protocol, ETH_P_ALL) ──▶ rx ring: frame slots shared with the kernel
//!                                              status KERNEL → USER → (we copy) → KERNEL
//!   sendmmsg(frames) ──PACKET_QDISC_BYPASS──▶ driver xmit        (not read back:
//!                                                                  PACKET_IGNORE_OUTGOING)
//! ```
//!
//! Why `TPACKET_V2` and not V3: V3 hands over blocks of frames, and a block is only handed
//! over when it is full or when its retire timer (milliseconds) fires, which adds up to that
//! timer to the latency of every frame at low rates (a ping); V2 hands over each frame as
//! soon as it is written, its slots have a fixed size (the largest frame), and its protocol
//! is one status word per slot. V3's better packing of small frames matters less here,
//! where every frame is copied out of the ring at once anyway.
//!
//! Transmission uses `sendmmsg` on the bound socket (one syscall per batch), not a tx ring:
//! a tx ring also needs one `send` per batch to start transmission, and `sendmmsg` needs no
//! second shared-memory protocol.
//!
//! 802.1Q tags: the kernel takes the outer tag out of received frames (into the slot's
//! `tp_vlan_tci`); [`RxFrame::vlan`] returns it so the caller can put it back.
//!
//! # Limitations
//! - Needs `CAP_NET_RAW` (and `CAP_NET_ADMIN` for promiscuous mode).
//! - A frame longer than a slot is truncated by the kernel: [`RxFrame::wire_len`] then exceeds
//!   the data, and the caller drops it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::{cvt, owned};

const ETH_P_ALL: u16 = 0x0003;
const TPACKET_V2: libc::c_int = 1;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
/// Most frames per `sendmmsg`.
pub const TX_BATCH: usize = 64;

/// `struct tpacket2_hdr`.
#[repr(C)]
struct Tpacket2Hdr {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_sec: u32,
    tp_nsec: u32,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
    tp_padding: [u8; 4],
}

/// `struct tpacket_req`.
#[repr(C)]
struct TpacketReq {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
}

/// `struct packet_mreq`.
#[repr(C)]
struct PacketMreq {
    ifindex: libc::c_int,
    type_: u16,
    alen: u16,
    address: [u8; 8],
}

/// Slot header and `sockaddr_ll` before the frame (`TPACKET2_HDRLEN`), rounded up to 16, plus
/// room for a frame's alignment: a slot holds at most `frame_size - SLOT_OVERHEAD` bytes.
pub const SLOT_OVERHEAD: usize = 64 + 16;

fn setsockopt<T>(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` points to a live `T` of the size passed; the kernel copies it in.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            std::ptr::from_ref(v).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Reads and clears a socket's pending error (`SO_ERROR`). A pending error makes the socket
/// report `EPOLLERR` to every poll, so an unread one keeps a sleeper awake.
pub(crate) fn take_error(fd: RawFd) -> Option<io::Error> {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `err` and `len` are live; the kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            std::ptr::addr_of_mut!(err).cast(),
            &mut len,
        )
    };
    match (r, err) {
        (-1, _) => Some(io::Error::last_os_error()),
        (_, 0) => None,
        (_, e) => Some(io::Error::from_raw_os_error(e)),
    }
}

fn packet_socket() -> io::Result<OwnedFd> {
    // Protocol 0: the socket receives nothing until it is bound with a protocol.
    // SAFETY: socket() has no memory-safety preconditions.
    Ok(owned(cvt(unsafe {
        libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0)
    })?))
}

fn add_promisc(fd: RawFd, ifindex: u32) -> io::Result<()> {
    let mreq = PacketMreq {
        ifindex: ifindex as libc::c_int,
        type_: libc::PACKET_MR_PROMISC as u16,
        alen: 0,
        address: [0; 8],
    };
    setsockopt(fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
}

/// Promiscuous mode on an interface for as long as this value lives: a packet socket's
/// `PACKET_MR_PROMISC` membership, which the kernel counts (other holders, such as
/// `ip link set promisc on` or tcpdump, are not disturbed) and drops when the socket closes,
/// also when the process is killed. `ip -d link` shows it as `promiscuity N`.
#[derive(Debug)]
pub struct Promisc {
    _fd: OwnedFd,
}

impl Promisc {
    /// Puts interface `ifindex` (of this thread's network namespace) in promiscuous mode.
    pub fn new(ifindex: u32) -> io::Result<Promisc> {
        let fd = packet_socket()?;
        add_promisc(fd.as_raw_fd(), ifindex)?;
        Ok(Promisc { _fd: fd })
    }
}

/// How to open a [`PacketSocket`].
#[derive(Debug, Clone, Copy)]
pub struct PacketOptions {
    /// Bytes per receive slot: a power of two ≥ 2048; the largest frame received whole is
    /// `slot_size - SLOT_OVERHEAD`.
    pub slot_size: u32,
    /// Receive slots (a power of two).
    pub slots: u32,
    /// Hold the interface in promiscuous mode while the socket is open.
    pub promisc: bool,
}

/// A packet socket bound to one interface: its receive and transmit halves.
#[derive(Debug)]
pub struct PacketSocket {
    pub rx: PacketRx,
    pub tx: PacketTx,
}

/// The receive half: the ring.
pub struct PacketRx {
    map: *mut u8,
    map_len: usize,
    slot_size: usize,
    slots: usize,
    head: usize,
    fd: Arc<OwnedFd>,
}

// SAFETY: the mapping is owned by this value and only accessed through `&mut self` (or
// `&self` for reading a status word atomically), so it moves with its sole user.
unsafe impl Send for PacketRx {}

impl std::fmt::Debug for PacketRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketRx")
            .field("fd", &self.fd)
            .field("slots", &self.slots)
            .field("slot_size", &self.slot_size)
            .finish()
    }
}

/// The transmit half: `sendmmsg` on the socket.
#[derive(Debug)]
pub struct PacketTx {
    fd: Arc<OwnedFd>,
}

/// One received frame.
#[derive(Debug)]
pub struct RxFrame<'a> {
    /// The bytes in the slot (without an 802.1Q tag the kernel took out; see `vlan`).
    pub data: &'a [u8],
    /// The frame's length on the wire (without the tag taken out); more than
    /// `data.len()` when the slot was too small.
    pub wire_len: usize,
    /// The outer 802.1Q tag the kernel took out of the frame: (TPID, TCI).
    pub vlan: Option<(u16, u16)>,
    /// The frame's L4 checksum is partial (a local sender's checksum offload,
    /// `TP_STATUS_CSUMNOTREADY`): it holds the pseudo-header sum only.
    pub csum_partial: bool,
}

impl PacketSocket {
    /// A socket on interface `ifindex` (of this thread's network namespace) receiving every
    /// protocol, with a receive ring, `PACKET_QDISC_BYPASS` and `PACKET_IGNORE_OUTGOING`.
    pub fn open(ifindex: u32, opts: PacketOptions) -> io::Result<PacketSocket> {
        if opts.slot_size < 2048
            || !opts.slot_size.is_power_of_two()
            || opts.slots == 0
            || !opts.slots.is_power_of_two()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "packet ring: slot size and slot count must be powers of two, slots >= 2048 B",
            ));
        }
        let fd = packet_socket()?;
        let raw = fd.as_raw_fd();
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VERSION, &TPACKET_V2)?;
        // Blocks of at least a page, holding whole slots.
        let block_size = opts.slot_size.max(1 << 16);
        let per_block = block_size / opts.slot_size;
        let slots = opts.slots.max(per_block);
        let req = TpacketReq {
            block_size,
            block_nr: slots / per_block,
            frame_size: opts.slot_size,
            frame_nr: slots,
        };
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        let map_len = block_size as usize * req.block_nr as usize;
        // SAFETY: a fresh shared mapping of the socket's ring, of the size just configured;
        // the kernel validates fd and length.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                raw,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let fd = Arc::new(fd);
        let rx = PacketRx {
            map: map.cast(),
            map_len,
            slot_size: opts.slot_size as usize,
            slots: slots as usize,
            head: 0,
            fd: Arc::clone(&fd),
        };
        let one: libc::c_int = 1;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one)?;
        setsockopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one)?;
        if opts.promisc {
            add_promisc(raw, ifindex)?;
        }
        // SAFETY: all-zero is a valid sockaddr_ll (plain integers).
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = ETH_P_ALL.to_be();
        sa.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: `sa` is a live sockaddr_ll of the size passed.
        cvt(unsafe {
            libc::bind(
                raw,
                std::ptr::addr_of!(sa).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(PacketSocket {
            rx,
            tx: PacketTx { fd },
        })
    }
}

impl PacketRx {
    fn status(&self, slot: usize) -> &AtomicU32 {
        // SAFETY: slot < slots, so the slot's header lies within the mapping; it starts at a
        // multiple of the slot size (≥ 2048), so the status word is aligned; the kernel
        // writes it concurrently, which is what the atomic is for.
        unsafe { &*self.map.add(slot * self.slot_size).cast::<AtomicU32>() }
    }

    /// Takes the socket's pending error, if any: `ENETDOWN` when the interface went down
    /// (the socket receives again when it comes back up) or was deleted. Until taken, the
    /// error makes every poll of the fd return at once.
    pub fn take_error(&self) -> Option<io::Error> {
        take_error(self.fd.as_raw_fd())
    }

    /// Whether the socket is still bound to its interface: `false` once the interface was
    /// deleted (the kernel then sets the bound index to -1), for good.
    pub fn bound(&self) -> bool {
        // SAFETY: all-zero is a valid sockaddr_ll (plain integers).
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `sa` and `len` are live; the kernel writes at most `len` bytes.
        let r = unsafe {
            libc::getsockname(
                self.fd.as_raw_fd(),
                std::ptr::addr_of_mut!(sa).cast(),
                &mut len,
            )
        };
        r == 0 && sa.sll_ifindex > 0
    }

    /// Whether a received frame is waiting.
    pub fn pending(&self) -> bool {
        self.status(self.head).load(Ordering::Acquire) & TP_STATUS_USER != 0
    }

    /// Receives up to `max` frames, handing each to `f`, and gives their slots back to the
    /// kernel. Returns the number of frames.
    pub fn recv(&mut self, max: usize, mut f: impl FnMut(RxFrame<'_>)) -> usize {
        let mut n = 0;
        while n < max {
            let status = self.status(self.head).load(Ordering::Acquire);
            if status & TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the slot is ours (TP_STATUS_USER, acquired above) until we store
            // TP_STATUS_KERNEL; its header lies at the slot's start within the mapping.
            let hdr = unsafe {
                std::ptr::read_volatile(
                    self.map
                        .add(self.head * self.slot_size)
                        .cast::<Tpacket2Hdr>(),
                )
            };
            let mac = usize::from(hdr.tp_mac);
            let snap = hdr.tp_snaplen as usize;
            let data = if mac.saturating_add(snap) <= self.slot_size {
                // SAFETY: [mac, mac+snap) lies within the slot (checked), which is ours
                // until it is returned below.
                unsafe {
                    std::slice::from_raw_parts(self.map.add(self.head * self.slot_size + mac), snap)
                }
            } else {
                &[]
            };
            let vlan = (status & TP_STATUS_VLAN_VALID != 0).then(|| {
                let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 {
                    hdr.tp_vlan_tpid
                } else {
                    0x8100
                };
                (tpid, hdr.tp_vlan_tci)
            });
            f(RxFrame {
                data,
                wire_len: (hdr.tp_len as usize).max(snap),
                vlan,
                csum_partial: status & TP_STATUS_CSUMNOTREADY != 0,
            });
            self.status(self.head)
                .store(TP_STATUS_KERNEL, Ordering::Release);
            self.head = (self.head + 1) % self.slots;
            n += 1;
        }
        n
    }

    /// Frames the kernel dropped (ring full) since the last call (`PACKET_STATISTICS`,
    /// which resets the kernel's counters).
    pub fn take_drops(&self) -> io::Result<u64> {
        let mut st = [0u32; 2]; // struct tpacket_stats { tp_packets, tp_drops }
        let mut len = std::mem::size_of_val(&st) as libc::socklen_t;
        // SAFETY: `st` and `len` are live; the kernel writes at most `len` bytes.
        cvt(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                st.as_mut_ptr().cast(),
                &mut len,
            )
        })?;
        Ok(u64::from(st[1]))
    }

    /// The largest frame received whole.
    pub fn max_frame(&self) -> usize {
        self.slot_size - SLOT_OVERHEAD
    }
}

impl AsRawFd for PacketRx {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for PacketRx {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the ring mapped in `open`; no slice into it outlives a
        // `recv` call.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

impl PacketTx {
    /// Sends `frames` (at most [`TX_BATCH`]) with one `sendmmsg`, without blocking. Returns
    /// how many were sent: fewer when the device queue is full (`EAGAIN`/`ENOBUFS` on the
    /// first counts as 0). Other errors are returned.
    pub fn send(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let frames = &frames[..frames.len().min(TX_BATCH)];
        if frames.is_empty() {
            return Ok(0);
        }
        let mut iov: [libc::iovec; TX_BATCH] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; TX_BATCH];
        // SAFETY: all-zero is a valid mmsghdr (null pointers, zero lengths).
        let mut msgs: [libc::mmsghdr; TX_BATCH] = unsafe { std::mem::zeroed() };
        for (i, f) in frames.iter().enumerate() {
            iov[i] = libc::iovec {
                iov_base: f.as_ptr().cast_mut().cast(),
                iov_len: f.len(),
            };
            msgs[i].msg_hdr.msg_iov = std::ptr::addr_of_mut!(iov[i]);
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..n]` are live mmsghdrs whose single iovec each points to a live
        // frame the kernel only reads; no address (the socket is bound to its interface).
        let r = unsafe {
            libc::sendmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                frames.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::ENOBUFS) => Ok(0),
                _ => Err(e),
            };
        }
        Ok(r as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(std::mem::size_of::<Tpacket2Hdr>(), 32);
        assert_eq!(std::mem::size_of::<TpacketReq>(), 16);
        assert_eq!(std::mem::size_of::<PacketMreq>(), 16);
        // TPACKET2_HDRLEN = align16(32) + sizeof(sockaddr_ll) = 52, frames at align16 = 64.
        const { assert!(SLOT_OVERHEAD >= 64) };
    }

    #[test]
    fn bad_options_are_refused() {
        let o = PacketOptions {
            slot_size: 1000,
            slots: 8,
            promisc: false,
        };
        let e = PacketSocket::open(1, o).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
