//! AF_XDP: the XDP redirect program, its XSKMAP, and AF_XDP sockets bound to one NIC queue,
//! with no BPF toolchain at build or run time.
//!
//! ```text
//!   NIC queue q ──▶ XDP program ──▶ XSKMAP[q] ──▶ Socket (rx ring) ──▶ the switch
//!                        │ no socket for q
//!                        ▼
//!                    XDP_PASS (the kernel's stack, as if nothing were attached)
//! ```
//!
//! The program is five hand-written instructions, the one libxdp and OVS load:
//! `return bpf_redirect_map(&xskmap, ctx->rx_queue_index, XDP_PASS)`. It is loaded with
//! `bpf(BPF_PROG_LOAD)` and attached with a BPF link (`BPF_LINK_CREATE`), which belongs to
//! this process: when the process exits, even by `kill -9`, the kernel detaches the program
//! and the interface carries traffic to its stack again. Nothing is pinned in bpffs.
//!
//! A [`Socket`] owns its UMEM (anonymous memory registered with the kernel) and the four
//! rings. The UMEM's frames are split in two: the first half is lent to the kernel through
//! the fill ring for receiving, the second half is the transmit pool, returned through the
//! completion ring. [`Socket::split`] cuts it along that line into a [`SocketRx`] (rx and
//! fill rings, receive half) and a [`SocketTx`] (tx and completion rings, transmit half),
//! which two threads can use at once. Frames are [`FRAME_SIZE`] (2048) bytes, or 4096 with
//! [`Socket::with_frame_size`]; a frame receives at most its size less [`RX_HEADROOM`], so
//! 1792 or 3840 bytes (larger frames need multi-buffer, which this does not use).
//!
//! [`SocketTx::push`] writes descriptors without publishing them and [`SocketTx::commit`]
//! publishes them and kicks the kernel, as many times as copy mode needs (it sends at most
//! 32 frames per kick). [`rx_queues`] and [`mtu`] query the interface through ioctls, so
//! they see the caller's network namespace.
//!
//! # Limitations
//! - Needs `CAP_NET_ADMIN`, `CAP_NET_RAW` and `CAP_BPF` (root here).
//! - One socket per queue, no shared UMEM between sockets.
//! - An XDP program attached by someone else through netlink (not a link) makes
//!   [`attach`] fail with `EBUSY`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::bpf::{
    self, BpfAttr, Insn, Jmp, Map, MapKind, ProgKind, Size, R0, R1, R10, R2, R3, R4, R6,
};
use crate::{cvt, owned};

const BPF_LINK_CREATE: libc::c_long = 28;

/// Bytes per UMEM frame.
pub const FRAME_SIZE: u32 = 2048;

/// `enum bpf_attach_type`: XDP.
pub(crate) const BPF_XDP: u32 = 37;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_DROP: i32 = 1;
const XDP_PASS: i32 = 2;
/// `offsetof(struct xdp_md, data)`, `data_end`, `rx_queue_index`.
const XDP_MD_DATA: i16 = 0;
const XDP_MD_DATA_END: i16 = 4;
const XDP_MD_RX_QUEUE_INDEX: i16 = 16;
/// The receive-metadata kfunc that returns a tag the device took out of the frame (Linux
/// 6.8): `int (const struct xdp_md *, __be16 *proto, u16 *tci)`.
pub const KFUNC_RX_VLAN_TAG: &str = "bpf_xdp_metadata_rx_vlan_tag";

/// An XSKMAP: NIC queue index → AF_XDP socket.
#[derive(Debug)]
pub struct XskMap {
    map: Map,
}

impl XskMap {
    /// A map for queues `0..entries`.
    pub fn new(entries: u32) -> io::Result<XskMap> {
        Ok(XskMap {
            map: Map::new(MapKind::XskMap, 4, 4, entries)?,
        })
    }

    /// Steers queue `queue` to `socket`.
    pub fn set(&self, queue: u32, socket: &Socket) -> io::Result<()> {
        self.in_range(queue)?;
        let fd = socket.as_raw_fd() as u32;
        self.map.update(&queue.to_ne_bytes(), &fd.to_ne_bytes())
    }

    /// Sends queue `queue` back to the kernel's stack.
    pub fn clear(&self, queue: u32) -> io::Result<()> {
        self.in_range(queue)?;
        self.map.delete(&queue.to_ne_bytes())
    }

    fn in_range(&self, queue: u32) -> io::Result<()> {
        if queue >= self.map.entries() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "queue {queue} beyond the map's {} entries",
                    self.map.entries()
                ),
            ));
        }
        Ok(())
    }
}

/// The loaded redirect program.
#[derive(Debug)]
pub struct Program {
    prog: bpf::Program,
}

/// `r2 = ctx->rx_queue_index; r1 = map; r3 = XDP_PASS; return bpf_redirect_map(r1, r2, r3)`.
fn redirect_insns(map: &Map) -> [Insn; 6] {
    let [m0, m1] = Insn::load_map(R1, map);
    [
        Insn::load(Size::W, R2, R1, XDP_MD_RX_QUEUE_INDEX),
        m0,
        m1,
        Insn::mov_imm(R3, XDP_PASS),
        Insn::call(bpf::FUNC_REDIRECT_MAP),
        Insn::exit(),
    ]
}

/// The redirect program that first puts back into the frame an 802.1Q/802.1ad tag the
/// device delivered out of band (`kfunc` is [`KFUNC_RX_VLAN_TAG`]'s BTF id):
///
/// ```text
///   if kfunc(ctx, &proto, &tci) == 0 {          // a tag out of band
///       if bpf_xdp_adjust_head(ctx, -4) != 0 { return XDP_DROP }   // never untagged
///       move the two addresses 4 bytes to the front; write proto, htons(tci) after them
///   }
///   return bpf_redirect_map(&xskmap, ctx->rx_queue_index, XDP_PASS)
/// ```
fn redirect_vlan_insns(map: &Map, kfunc: u32) -> Vec<Insn> {
    let [m0, m1] = Insn::load_map(R1, map);
    vec![
        Insn::mov_reg(R6, R1),
        // proto at fp-2, tci at fp-4
        Insn::mov_imm(R2, 0),
        Insn::store(Size::W, R10, -4, R2),
        Insn::mov_reg(R2, R10),
        Insn::alu_imm(bpf::Alu::Add, R2, -2),
        Insn::mov_reg(R3, R10),
        Insn::alu_imm(bpf::Alu::Add, R3, -4),
        Insn::call_kfunc(kfunc),
        Insn::jump_imm(Jmp::Ne, R0, 0, 18), // → redirect
        Insn::mov_reg(R1, R6),
        Insn::mov_imm(R2, -4),
        Insn::call(bpf::FUNC_XDP_ADJUST_HEAD),
        Insn::jump_imm(Jmp::Ne, R0, 0, 21), // → drop
        Insn::load(Size::W, R2, R6, XDP_MD_DATA),
        Insn::load(Size::W, R3, R6, XDP_MD_DATA_END),
        Insn::mov_reg(R4, R2),
        Insn::alu_imm(bpf::Alu::Add, R4, 18),
        Insn::jump_reg(Jmp::Gt, R4, R3, 16), // → drop
        Insn::load(Size::DW, R4, R2, 4),
        Insn::store(Size::DW, R2, 0, R4),
        Insn::load(Size::W, R4, R2, 12),
        Insn::store(Size::W, R2, 8, R4),
        Insn::load(Size::H, R4, R10, -2),
        Insn::store(Size::H, R2, 12, R4),
        Insn::load(Size::H, R4, R10, -4),
        Insn::to_be16(R4),
        Insn::store(Size::H, R2, 14, R4),
        // redirect:
        Insn::mov_reg(R1, R6),
        Insn::load(Size::W, R2, R1, XDP_MD_RX_QUEUE_INDEX),
        m0,
        m1,
        Insn::mov_imm(R3, XDP_PASS),
        Insn::call(bpf::FUNC_REDIRECT_MAP),
        Insn::exit(),
        // drop:
        Insn::mov_imm(R0, XDP_DROP),
        Insn::exit(),
    ]
}

impl Program {
    /// Loads the redirect program for `map`. A verifier refusal comes back with the
    /// verifier's log in the error.
    pub fn redirect(map: &XskMap) -> io::Result<Program> {
        let prog = bpf::Program::load(ProgKind::Xdp, &redirect_insns(&map.map), "qs_redirect")?;
        Ok(Program { prog })
    }

    /// The redirect program bound to interface `ifindex` (native mode only) that puts an
    /// 802.1Q tag the device delivered out of band back into the frame first, through
    /// kernel function `kfunc` ([`KFUNC_RX_VLAN_TAG`], [`bpf::kfunc_id`]): so that the
    /// switch classifies every frame by its VID, however the tag arrived.
    pub fn redirect_vlan(map: &XskMap, ifindex: u32, kfunc: u32) -> io::Result<Program> {
        let prog = bpf::Program::load_for(
            ProgKind::Xdp,
            &redirect_vlan_insns(&map.map, kfunc),
            "qs_redirect_vl",
            Some(ifindex),
        )?;
        Ok(Program { prog })
    }
}

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver (`XDP_FLAGS_DRV_MODE`): fails where the driver has no XDP.
    Native,
    /// Generic XDP on the skb (`XDP_FLAGS_SKB_MODE`): works on every interface.
    Generic,
}

/// An attached program; dropping it (or the process ending) detaches it.
pub use crate::bpf::Link;

/// Attaches `prog` to interface `ifindex`.
pub fn attach(prog: &Program, ifindex: u32, mode: AttachMode) -> io::Result<Link> {
    let flags = match mode {
        AttachMode::Native => XDP_FLAGS_DRV_MODE,
        AttachMode::Generic => XDP_FLAGS_SKB_MODE,
    };
    let mut a = BpfAttr::new();
    // prog_fd, target_ifindex, attach_type, flags
    a.u32(0, prog.prog.as_raw_fd() as u32)
        .u32(4, ifindex)
        .u32(8, BPF_XDP)
        .u32(12, flags);
    bpf::bpf(BPF_LINK_CREATE, &mut a).map(Link::from_fd)
}

/// Whether an [`attach`] error means the interface already has an XDP program (attached
/// through netlink or by another link): `EBUSY` or `EEXIST`.
pub fn already_attached(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EEXIST))
}

/// The index of interface `name` in this thread's network namespace.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i)
}

/// How a socket binds to its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMode {
    /// The driver DMAs into the UMEM (`XDP_ZEROCOPY`); needs driver support.
    ZeroCopy,
    /// The kernel copies (`XDP_COPY`); works with native and generic XDP.
    Copy,
}

/// A mapped ring shared with the kernel: producer and consumer indices and `size` entries.
struct Ring<T> {
    map: *mut libc::c_void,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    mask: u32,
}

impl<T: Copy> Ring<T> {
    /// Maps ring `off` of `fd` at page offset `pgoff`.
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
    ) -> io::Result<Ring<T>> {
        let map_len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        // SAFETY: a fresh shared mapping of the socket's ring at the offset the kernel
        // defined for it; the kernel validates fd, length and offset.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = map.cast::<u8>();
        // SAFETY: the kernel's offsets lie within the mapping of `map_len` bytes (the
        // descriptors start at `desc`, the indices and flags before it), and are aligned for
        // their types (u32 indices, u64/xdp_desc entries).
        unsafe {
            Ok(Ring {
                map,
                map_len,
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                flags: base.add(off.flags as usize).cast(),
                descs: base.add(off.desc as usize).cast(),
                mask: size - 1,
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `map`); the kernel updates it
        // concurrently, which is what the atomic is for.
        unsafe { &*self.producer }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as in `producer`.
        unsafe { &*self.consumer }
    }
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as in `producer`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }
    fn get(&self, idx: u32) -> T {
        // SAFETY: `idx & mask` < size, so the slot lies in the mapping; the slot was
        // published by the producer's release store that the caller acquired.
        unsafe { std::ptr::read_volatile(self.descs.add((idx & self.mask) as usize)) }
    }
    fn set(&self, idx: u32, v: T) {
        // SAFETY: `idx & mask` < size; the slot is ours until the producer index that
        // covers it is released.
        unsafe { std::ptr::write_volatile(self.descs.add((idx & self.mask) as usize), v) }
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`; no reference into it outlives
        // the ring.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// Counters the kernel keeps for a socket (`XDP_STATISTICS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Dropped for other reasons (e.g. no fill buffer in time, or a frame larger than a
    /// UMEM frame).
    pub rx_dropped: u64,
    /// Dropped because of invalid descriptors.
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    /// Dropped because the rx ring was full.
    pub rx_ring_full: u64,
    /// Times the fill ring was empty.
    pub rx_fill_ring_empty_descs: u64,
    pub tx_ring_empty_descs: u64,
}

/// Headroom the kernel keeps in front of every received frame in a UMEM frame
/// (`XDP_PACKET_HEADROOM`): a frame of `frame_size` bytes receives at most
/// `frame_size - RX_HEADROOM` bytes.
pub const RX_HEADROOM: u32 = 256;

/// The socket and its UMEM, shared by the two halves. Field order is drop order: the
/// socket closes (the kernel lets go of the UMEM) before the UMEM is unmapped.
struct Core {
    fd: OwnedFd,
    umem: Umem,
    frame_size: u32,
}

/// An AF_XDP socket bound to one queue of one interface, with its UMEM and rings.
///
/// It can be used whole ([`Socket::recv`], [`Socket::send`]) or split into its receive and
/// transmit halves ([`Socket::split`]), which touch disjoint rings and disjoint halves of
/// the UMEM, so two threads can use them at once.
pub struct Socket {
    rx: SocketRx,
    tx: SocketTx,
}

/// The receive half: the rx and fill rings and the first half of the UMEM.
pub struct SocketRx {
    // Drop order: rings first, then (when the last half goes) the socket and the UMEM.
    rx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    core: Arc<Core>,
}

/// The transmit half: the tx and completion rings and the second half of the UMEM.
pub struct SocketTx {
    tx: Ring<libc::xdp_desc>,
    comp: Ring<u64>,
    core: Arc<Core>,
    /// Transmit frames not in flight.
    free: Vec<u64>,
    /// Descriptors written after the producer index, not yet published.
    pending: u32,
    zero_copy: bool,
}

// SAFETY: the raw pointers refer to mappings owned by the half (its rings) or shared through
// the `Arc<Core>` (the UMEM); each half only touches its own rings and its own half of the
// UMEM, through `&mut self` (or `&self` for reads of kernel-written indices), so moving a
// half to another thread moves their sole user with it.
unsafe impl Send for SocketRx {}
// SAFETY: as for `SocketRx`.
unsafe impl Send for SocketTx {}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Socket")
            .field("fd", &self.rx.core.fd)
            .field("zero_copy", &self.tx.zero_copy)
            .finish()
    }
}

impl std::fmt::Debug for SocketRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketRx")
            .field("fd", &self.core.fd)
            .finish()
    }
}

impl std::fmt::Debug for SocketTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketTx")
            .field("fd", &self.core.fd)
            .field("free", &self.free.len())
            .finish()
    }
}

fn setsockopt<T>(fd: RawFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` points to a live `T` of the size passed; SOL_XDP options copy it in.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            std::ptr::from_ref(v).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

impl Socket {
    /// A socket on queue `queue` of interface `ifindex`, with `frames` UMEM frames of
    /// [`FRAME_SIZE`] bytes (a power of two ≥ 4; half for receiving, half for sending) and
    /// rings of `frames / 2` entries.
    pub fn new(ifindex: u32, queue: u32, frames: u32, mode: BindMode) -> io::Result<Socket> {
        Socket::with_frame_size(ifindex, queue, frames, FRAME_SIZE, mode)
    }

    /// [`Socket::new`] with UMEM frames of `frame_size` bytes (2048 or 4096): the largest
    /// frame received is `frame_size - RX_HEADROOM`, the largest sent `frame_size`.
    pub fn with_frame_size(
        ifindex: u32,
        queue: u32,
        frames: u32,
        frame_size: u32,
        mode: BindMode,
    ) -> io::Result<Socket> {
        if frames < 4 || !frames.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UMEM frames must be a power of two >= 4",
            ));
        }
        if frame_size != 2048 && frame_size != 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UMEM frame size must be 2048 or 4096",
            ));
        }
        let ring = frames / 2;
        // SAFETY: socket() has no memory-safety preconditions.
        let fd = owned(cvt(unsafe {
            libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0)
        })?);
        let raw = fd.as_raw_fd();
        let umem_len = frames as usize * frame_size as usize;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let umem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let core = Arc::new(Core {
            fd,
            umem: Umem {
                ptr: umem.cast(),
                len: umem_len,
            },
            frame_size,
        });
        let reg = libc::xdp_umem_reg {
            addr: core.umem.ptr as u64,
            len: umem_len as u64,
            chunk_size: frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        let setup = || -> io::Result<libc::xdp_mmap_offsets> {
            setsockopt(raw, libc::XDP_UMEM_REG, &reg)?;
            setsockopt(raw, libc::XDP_UMEM_FILL_RING, &ring)?;
            setsockopt(raw, libc::XDP_UMEM_COMPLETION_RING, &ring)?;
            setsockopt(raw, libc::XDP_RX_RING, &ring)?;
            setsockopt(raw, libc::XDP_TX_RING, &ring)?;
            // SAFETY: all-zero is a valid xdp_mmap_offsets (plain integers).
            let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
            // SAFETY: `off` and `len` are live and `len` is off's size; the kernel writes at
            // most `len` bytes.
            cvt(unsafe {
                libc::getsockopt(
                    raw,
                    libc::SOL_XDP,
                    libc::XDP_MMAP_OFFSETS,
                    std::ptr::addr_of_mut!(off).cast(),
                    &mut len,
                )
            })?;
            Ok(off)
        };
        let off = setup()?;
        let rx = SocketRx {
            rx: Ring::map(raw, &off.rx, ring, libc::XDP_PGOFF_RX_RING)?,
            fill: Ring::map(raw, &off.fr, ring, libc::XDP_UMEM_PGOFF_FILL_RING as i64)?,
            core: Arc::clone(&core),
        };
        let tx = SocketTx {
            tx: Ring::map(raw, &off.tx, ring, libc::XDP_PGOFF_TX_RING)?,
            comp: Ring::map(
                raw,
                &off.cr,
                ring,
                libc::XDP_UMEM_PGOFF_COMPLETION_RING as i64,
            )?,
            core,
            free: (ring..frames)
                .rev()
                .map(|i| u64::from(i) * u64::from(frame_size))
                .collect(),
            pending: 0,
            zero_copy: mode == BindMode::ZeroCopy,
        };
        // All receive frames go to the kernel before binding.
        let p = rx.fill.producer().load(Ordering::Relaxed);
        for i in 0..ring {
            rx.fill
                .set(p.wrapping_add(i), u64::from(i) * u64::from(frame_size));
        }
        rx.fill
            .producer()
            .store(p.wrapping_add(ring), Ordering::Release);
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_USE_NEED_WAKEUP
                | match mode {
                    BindMode::ZeroCopy => libc::XDP_ZEROCOPY,
                    BindMode::Copy => libc::XDP_COPY,
                },
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `sa` is a live sockaddr_xdp of the size passed.
        cvt(unsafe {
            libc::bind(
                raw,
                std::ptr::addr_of!(sa).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        })?;
        Ok(Socket { rx, tx })
    }

    /// Whether the socket was bound zero-copy.
    pub fn zero_copy(&self) -> bool {
        self.tx.zero_copy
    }

    /// Receives up to `max` frames, handing each to `f`, then gives their buffers back to the
    /// kernel. Returns the number of frames.
    pub fn recv(&mut self, max: usize, f: impl FnMut(&[u8])) -> usize {
        self.rx.recv(max, f)
    }

    /// Queues `frames` for transmission (each at most the frame size; longer ones are
    /// skipped) and kicks the kernel. Returns how many were queued; the rest did not fit
    /// (no free transmit frame or ring slot).
    pub fn send<'a>(&mut self, frames: impl IntoIterator<Item = &'a [u8]>) -> usize {
        self.tx.send(frames)
    }

    /// The kernel's counters for this socket.
    pub fn stats(&self) -> io::Result<Stats> {
        self.rx.stats()
    }

    /// The receive and transmit halves, for use from different threads.
    pub fn split(self) -> (SocketRx, SocketTx) {
        (self.rx, self.tx)
    }
}

impl SocketRx {
    /// Receives up to `max` frames, handing each to `f`, then gives their buffers back to the
    /// kernel. Returns the number of frames.
    pub fn recv(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let cons = self.rx.consumer().load(Ordering::Relaxed);
        let avail = self
            .rx
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(cons);
        let n = avail.min(max as u32);
        if n == 0 {
            if self.fill.needs_wakeup() {
                self.kick();
            }
            return 0;
        }
        let fs = u64::from(self.core.frame_size);
        let fp = self.fill.producer().load(Ordering::Relaxed);
        for i in 0..n {
            let d = self.rx.get(cons.wrapping_add(i));
            if let Some(bytes) = self.frame(d.addr, d.len) {
                f(bytes);
            }
            // The buffer's base address (the kernel may have added an offset).
            self.fill.set(fp.wrapping_add(i), d.addr - d.addr % fs);
        }
        self.rx
            .consumer()
            .store(cons.wrapping_add(n), Ordering::Release);
        // The fill ring has room: it is as large as the receive half of the UMEM, and each
        // buffer is in exactly one of fill, rx or our hands.
        self.fill
            .producer()
            .store(fp.wrapping_add(n), Ordering::Release);
        n as usize
    }

    /// Takes the socket's pending error, if any: `ENETDOWN` once the interface was deleted
    /// (the socket is unbound for good).
    pub fn take_error(&self) -> Option<io::Error> {
        crate::packet::take_error(self.core.fd.as_raw_fd())
    }

    /// Whether received frames are waiting.
    pub fn pending(&self) -> bool {
        self.rx.producer().load(Ordering::Acquire) != self.rx.consumer().load(Ordering::Relaxed)
    }

    /// Before sleeping on the socket's fd: wakes the driver if it asked to be woken to
    /// refill (need_wakeup on the fill ring) and says whether sleeping is safe (`false`:
    /// frames are already waiting).
    pub fn arm(&self) -> bool {
        if self.fill.needs_wakeup() {
            self.kick();
        }
        !self.pending()
    }

    fn frame(&self, addr: u64, len: u32) -> Option<&[u8]> {
        let end = addr.checked_add(u64::from(len))?;
        // Receive buffers are the first half of the UMEM.
        if end > self.core.umem.len as u64 / 2 {
            return None;
        }
        // SAFETY: [addr, addr+len) lies within the receive half of the UMEM (checked
        // above), which the transmit half never touches; the kernel finished writing it
        // before publishing the descriptor we acquired and does not touch the buffer again
        // until we return it through the fill ring.
        Some(unsafe {
            std::slice::from_raw_parts(self.core.umem.ptr.add(addr as usize), len as usize)
        })
    }

    fn kick(&self) {
        // SAFETY: a zero-length recvfrom with no buffer only wakes the kernel's receive path.
        unsafe {
            libc::recvfrom(
                self.core.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }

    /// The kernel's counters for this socket.
    pub fn stats(&self) -> io::Result<Stats> {
        stats(self.core.fd.as_raw_fd())
    }

    /// The largest frame the socket receives.
    pub fn max_frame(&self) -> usize {
        (self.core.frame_size - RX_HEADROOM) as usize
    }
}

impl AsRawFd for SocketRx {
    fn as_raw_fd(&self) -> RawFd {
        self.core.fd.as_raw_fd()
    }
}

impl SocketTx {
    /// Queues `frames` (see [`SocketTx::push`]) and kicks the kernel ([`SocketTx::commit`]).
    /// Returns how many were queued; the rest did not fit.
    pub fn send<'a>(&mut self, frames: impl IntoIterator<Item = &'a [u8]>) -> usize {
        let mut n = 0;
        for frame in frames {
            if frame.len() > self.max_frame() {
                continue;
            }
            if !self.push(frame) {
                break;
            }
            n += 1;
        }
        self.commit();
        n
    }

    /// Copies `frame` into a free transmit frame and writes its descriptor, without
    /// publishing it yet. `false` when there is no room (no free frame or ring slot) or the
    /// frame is longer than the frame size. Call [`SocketTx::commit`] after the last push.
    pub fn push(&mut self, frame: &[u8]) -> bool {
        if frame.len() > self.max_frame() {
            return false;
        }
        if self.free.is_empty() {
            self.reclaim();
        }
        let prod = self.tx.producer().load(Ordering::Relaxed);
        let cons = self.tx.consumer().load(Ordering::Acquire);
        let used = prod.wrapping_sub(cons).wrapping_add(self.pending);
        if used > self.tx.mask {
            return false;
        }
        let Some(addr) = self.free.pop() else {
            return false;
        };
        // SAFETY: `addr` is the base of a transmit frame of frame_size bytes within the
        // transmit half of the UMEM (the free list only holds such addresses: see `new` and
        // the check in `reclaim`) that the kernel is not using (it is in our free list), and
        // frame.len() <= frame_size.
        unsafe {
            std::ptr::copy_nonoverlapping(
                frame.as_ptr(),
                self.core.umem.ptr.add(addr as usize),
                frame.len(),
            );
        }
        self.tx.set(
            prod.wrapping_add(self.pending),
            libc::xdp_desc {
                addr,
                len: frame.len() as u32,
                options: 0,
            },
        );
        self.pending += 1;
        true
    }

    /// Publishes the pushed descriptors and kicks the kernel until it has taken them (copy
    /// mode sends at most 32 per kick) or stops making progress.
    pub fn commit(&mut self) {
        if self.pending == 0 {
            return;
        }
        let prod = self.tx.producer().load(Ordering::Relaxed);
        self.tx
            .producer()
            .store(prod.wrapping_add(self.pending), Ordering::Release);
        self.pending = 0;
        if !self.zero_copy || self.tx.needs_wakeup() {
            // Bounded: one kick per 32 descriptors of a full ring, plus one.
            for _ in 0..=(self.tx.mask + 1) / 32 {
                if !self.kick() {
                    break;
                }
            }
        }
        self.reclaim();
    }

    /// Returns completed transmit frames to the free list.
    fn reclaim(&mut self) {
        let cons = self.comp.consumer().load(Ordering::Relaxed);
        let n = self
            .comp
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(cons);
        let fs = u64::from(self.core.frame_size);
        let (lo, hi) = (self.core.umem.len as u64 / 2, self.core.umem.len as u64);
        for i in 0..n {
            let addr = self.comp.get(cons.wrapping_add(i));
            // Only addresses we lent out come back; anything else is not reused (`push`
            // writes a whole frame at the address).
            if addr >= lo && addr.saturating_add(fs) <= hi && addr & (fs - 1) == 0 {
                self.free.push(addr);
            }
        }
        if n > 0 {
            self.comp
                .consumer()
                .store(cons.wrapping_add(n), Ordering::Release);
        }
    }

    /// Kicks transmission; `true` if the kernel stopped with descriptors left (`EAGAIN`,
    /// `EBUSY`, `ENOBUFS`), so another kick may send more.
    fn kick(&self) -> bool {
        // SAFETY: a zero-length sendto with no buffer and no address only kicks transmission.
        let r = unsafe {
            libc::sendto(
                self.core.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r >= 0 {
            return false;
        }
        let e = io::Error::last_os_error().raw_os_error();
        let more = matches!(e, Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS));
        more && self.tx.producer().load(Ordering::Relaxed)
            != self.tx.consumer().load(Ordering::Acquire)
    }

    /// The largest frame the socket sends.
    pub fn max_frame(&self) -> usize {
        self.core.frame_size as usize
    }

    /// Whether the socket was bound zero-copy.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }
}

fn stats(fd: RawFd) -> io::Result<Stats> {
    // SAFETY: all-zero is a valid xdp_statistics (plain integers).
    let mut s: libc::xdp_statistics = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
    // SAFETY: `s` and `len` are live; the kernel writes at most `len` bytes.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
            std::ptr::addr_of_mut!(s).cast(),
            &mut len,
        )
    })?;
    Ok(Stats {
        rx_dropped: s.rx_dropped,
        rx_invalid_descs: s.rx_invalid_descs,
        tx_invalid_descs: s.tx_invalid_descs,
        rx_ring_full: s.rx_ring_full,
        rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
        tx_ring_empty_descs: s.tx_ring_empty_descs,
    })
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.rx.core.fd.as_raw_fd()
    }
}

/// The UMEM mapping; the core's last field, so it is unmapped after the socket is closed.
struct Umem {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by the `Core`; the halves that share it use
// disjoint parts of it (see `SocketRx`/`SocketTx`), and the pointer is only dereferenced
// through them.
unsafe impl Send for Umem {}
// SAFETY: as above; `Core` is only shared read-only (the pointer and length never change).
unsafe impl Sync for Umem {}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `Socket::with_frame_size`; no slice into it
        // outlives the socket, and the kernel released it when the socket closed (the
        // socket fd is dropped before this field).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The number of receive queues of interface `name` in this thread's network namespace:
/// the ethtool channels (`combined + rx`; `ETHTOOL_GCHANNELS`), or, for drivers without
/// channels, `/sys/class/net/NAME/queues/rx-*` (which shows the namespace sysfs was
/// mounted in), or 1.
pub fn rx_queues(name: &str) -> io::Result<u32> {
    match ethtool_channels(name) {
        Ok(ch) if ch.combined_count + ch.rx_count > 0 => Ok(ch.combined_count + ch.rx_count),
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Err(e),
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => Err(e),
        _ => {
            let dir = format!("/sys/class/net/{name}/queues");
            let n = std::fs::read_dir(dir)
                .map(|d| {
                    d.filter_map(Result::ok)
                        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                        .count() as u32
                })
                .unwrap_or(0);
            Ok(n.max(1))
        }
    }
}

/// `struct ethtool_channels`.
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// `struct ifreq` with a pointer in its union (`ifr_data`) or an int (`ifr_mtu`).
#[repr(C)]
struct IfReqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: u64,
    _pad: [u8; std::mem::size_of::<libc::ifreq>() - libc::IFNAMSIZ - 8],
}

fn ifreq_data(name: &str, data: u64) -> io::Result<IfReqData> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a valid interface name"),
        ));
    }
    let mut r = IfReqData {
        name: [0; libc::IFNAMSIZ],
        data,
        _pad: [0; std::mem::size_of::<libc::ifreq>() - libc::IFNAMSIZ - 8],
    };
    for (d, &b) in r.name.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    Ok(r)
}

fn ioctl_ifreq(req: libc::c_ulong, r: &mut IfReqData) -> io::Result<()> {
    // SAFETY: socket() has no memory-safety preconditions.
    let sock = owned(cvt(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
    })?);
    // SAFETY: `r` is a live, exclusively borrowed ifreq-sized value; for SIOCETHTOOL its
    // data pointer points to a live ethtool struct of the size the command implies (set by
    // the caller), for SIOCGIFMTU the kernel writes an int into the union.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), req as libc::Ioctl, std::ptr::from_mut(r)) })
        .map(drop)
}

fn ethtool_channels(name: &str) -> io::Result<EthtoolChannels> {
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..EthtoolChannels::default()
    };
    let mut r = ifreq_data(name, std::ptr::addr_of_mut!(ch) as u64)?;
    ioctl_ifreq(libc::SIOCETHTOOL, &mut r)?;
    Ok(ch)
}

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

const ETHTOOL_GFLAGS: u32 = 0x25;
const ETHTOOL_SFLAGS: u32 = 0x26;
/// `ETH_FLAG_RXVLAN`: receive VLAN offload (`rx-vlan-hw-parse`, `NETIF_F_HW_VLAN_CTAG_RX`).
const ETH_FLAG_RXVLAN: u32 = 1 << 8;

fn ethtool_flags(name: &str, set: Option<u32>) -> io::Result<u32> {
    let mut v = EthtoolValue {
        cmd: if set.is_some() {
            ETHTOOL_SFLAGS
        } else {
            ETHTOOL_GFLAGS
        },
        data: set.unwrap_or(0),
    };
    let mut r = ifreq_data(name, std::ptr::addr_of_mut!(v) as u64)?;
    ioctl_ifreq(libc::SIOCETHTOOL, &mut r)?;
    Ok(v.data)
}

/// Whether interface `name` has receive VLAN offload on (the device takes the 802.1Q tag
/// out of the frame and delivers it beside it, where XDP does not see it).
pub fn rx_vlan_offload(name: &str) -> io::Result<bool> {
    Ok(ethtool_flags(name, None)? & ETH_FLAG_RXVLAN != 0)
}

/// Receive VLAN offload turned off on an interface while this lives; dropping it turns it
/// back on (if this turned it off). `kill -9` leaves it off: harmless, the kernel's stack
/// then takes the tags out in software.
#[derive(Debug)]
pub struct RxVlanOff {
    ifname: String,
    restore: bool,
}

impl RxVlanOff {
    /// Turns receive VLAN offload off on `name` (`ETHTOOL_SFLAGS`), and checks that it is.
    pub fn new(name: &str) -> io::Result<RxVlanOff> {
        let flags = ethtool_flags(name, None)?;
        if flags & ETH_FLAG_RXVLAN == 0 {
            return Ok(RxVlanOff {
                ifname: name.to_string(),
                restore: false,
            });
        }
        ethtool_flags(name, Some(flags & !ETH_FLAG_RXVLAN))?;
        if rx_vlan_offload(name)? {
            return Err(io::Error::other("the driver keeps it on"));
        }
        Ok(RxVlanOff {
            ifname: name.to_string(),
            restore: true,
        })
    }
}

impl Drop for RxVlanOff {
    fn drop(&mut self) {
        if self.restore {
            if let Ok(flags) = ethtool_flags(&self.ifname, None) {
                let _ = ethtool_flags(&self.ifname, Some(flags | ETH_FLAG_RXVLAN));
            }
        }
    }
}

/// `struct ethtool_drvinfo` (the driver's name is all that is read).
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    rest: [u8; 32 * 4 + 12 + 5 * 4],
}

const ETHTOOL_GDRVINFO: u32 = 0x03;

/// The driver of interface `name` in this thread's network namespace (`ETHTOOL_GDRVINFO`):
/// `veth`, `tun`, `virtio_net`, ...
pub fn driver(name: &str) -> io::Result<String> {
    let mut info = EthtoolDrvinfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        rest: [0; 32 * 4 + 12 + 5 * 4],
    };
    let mut r = ifreq_data(name, std::ptr::addr_of_mut!(info) as u64)?;
    ioctl_ifreq(libc::SIOCETHTOOL, &mut r)?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// The MTU of interface `name` in this thread's network namespace (`SIOCGIFMTU`).
pub fn mtu(name: &str) -> io::Result<u32> {
    let mut r = ifreq_data(name, 0)?;
    ioctl_ifreq(libc::SIOCGIFMTU, &mut r)?;
    // ifr_mtu is an int at the start of the union.
    let b = r.data.to_ne_bytes();
    let mtu = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    u32::try_from(mtu).map_err(|_| io::Error::other(format!("{name}: negative MTU {mtu}")))
}
