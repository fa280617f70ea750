//! veth ports: a network namespace (a container) attached through a veth pair, with a
//! kernel fast path for known unicast between veth ports.
//!
//! ```text
//!  netns A                 root netns                                      netns B
//!  eth0 ══ veth ══ qs-a ─tcx ingress: fast path program─┐                  eth0
//!                    │  dst MAC known on veth port b,     │ bpf_redirect_peer(qs-b)  ▲
//!                    │  src MAC known on a, same VLAN ────┼──────────────────────────┘
//!                    │  anything else                     │
//!                    ▼  bpf_redirect(tap egress)          │
//!                  qsv<ifindex> (TAP, the slow path) ◀────┘  its egress takes only these
//!                    │ read by qswitch's workers: learning, flooding, policy, QoS,
//!                    │ capture, every other port kind
//!                    ▲ written by the workers
//!                  TAP's tcx ingress program: bpf_redirect_peer(qs-a) ──▶ netns A
//! ```
//!
//! A TAP port costs two copies of every byte through the kernel and a thread hop per frame,
//! where the kernel's bridge costs neither (`bench tap-tcp` and `bench affinity` measure
//! both against a bare relay between two TAPs and the kernel's least forwarding). A veth
//! port keeps the kernel's path for what needs no decision of the switch's: a frame from a
//! namespace whose source is learnt on this port and whose destination is learnt on
//! another veth port in the same VLAN goes from one namespace straight into the other, in
//! the sender's own system call, without a copy (`bpf_redirect_peer`, as Cilium does
//! between pods). Everything else — broadcast, multicast, unknown or moved addresses,
//! tagged frames, frames to or from other kinds of port, and ports whose policy the
//! workers must apply — goes through the slow path, a TAP that qswitch reads and writes
//! like any TAP port: so learning, flooding, VLANs, port security, storm control, QoS,
//! capture and trace all stay the switch's.
//!
//! The fast path's state is one BPF hash map, (VLAN, MAC) → (destination veth, port,
//! seen), which [`FastPath::sync`] mirrors from the switch's fdb: only addresses learnt on
//! veth ports whose fast path is on, in their access VLAN. A port is left out (so its
//! frames take the slow path both ways) while it is a trunk, an uplink, has a QoS
//! guarantee or limit or per-frame port security checks, has security groups (the firewall
//! runs in userspace: docs/firewall.md), is being captured or mirrored (a mirror session's
//! source or output), or is disabled
//! by BPDU guard (from the next housekeeping tick). (Storm control and link-local frames
//! need nothing: broadcast and multicast always take the slow path.) The program counts what it forwards per port in a
//! per-CPU array; the switch adds those counters to the port's own, and every second
//! refreshes (and clears) the fdb entries the program marked seen, so that addresses in
//! use on the fast path do not age out.
//!
//! Known unicast to and from MACs behind a remote VTEP of a VXLAN port stays in the
//! kernel too: the program encapsulates it and the underlay's ingress program
//! decapsulates it ([`overlay`]; docs/overlay.md, "veth ports across hosts").
//!
//! The root end's program is attached with a tcx link owned by the process (see
//! [`qswitch_sys::bpf`]): removing the port, stopping qswitch or `kill -9` detaches it. The
//! companion TAP goes with its last fd, and with it its two programs, classic tc filters
//! (a tcx link costs an RCU grace period under RTNL, a filter microseconds: docs/veth.md,
//! "How the programs are attached"). The veth pair itself belongs to whoever made it.
//!
//! The root end is never a door into the host (audit finding F2): before it is brought up,
//! [`qswitch_sys::netif::seal`] turns its IPv6 address generation off (no link-local, now or
//! later; rtnetlink, so it works where `/proc/sys` is read-only), deletes any address on it
//! and sets `IFF_NOARP`; removing the port sets it down. A `kill -9` leaves it up and sealed:
//! with no address, no link-local and no ARP answers, the namespace has no address of the
//! host to reach through it (docs/veth.md).
//!
//! # Limitations
//! - The first frames of a flow, until the next sync (every 100 ms), take the slow path.
//! - A MAC that moves between veth ports is forwarded to its old port by the fast path
//!   until the switch learns the move from a frame the new port sends through the slow path
//!   (the source check sends every frame whose source is not learnt on its port there).
//! - Needs Linux 6.6 (tcx) and `CAP_BPF`.

mod overlay;

use std::collections::HashMap;
use std::io;

use parking_lot::Mutex;
use qswitch_api::request::FastPathStats;
use qswitch_sys::bpf::{
    self, skb, Alu, Insn, Jmp, Link, Map, MapKind, ProgKind, Program, Size, TcHook, R0, R1, R10,
    R2, R3, R4, R5, R6, R7, R8, R9,
};
use qswitch_wire::mac::MacAddr;

use super::tap::{TapError, TapPort};
use super::{Port, TxDone};
use crate::fdb::Fdb;
use crate::ids::PortId;
use crate::packet::Pkt;
use crate::stats::DropTally;

pub use overlay::OverlayPort;

/// Addresses the fast path map holds at most.
const FDB_ENTRIES: u32 = 16_384;
/// Bytes of a map value: destination ifindex (u32), port (u32), seen (u64: set by the
/// program when it forwards a frame from the address, cleared by the switch's refresh).
const VALUE: usize = 16;
/// Bytes of a counter: rx packets, rx bytes, tx packets, tx bytes, drops (u64 each).
const COUNTER: usize = 40;

/// Errors opening a veth port.
#[derive(Debug, thiserror::Error)]
pub enum VethError {
    #[error("interface {0} does not exist")]
    NoSuchInterface(String),
    #[error("{ifname} is not a veth interface (its driver: {driver})")]
    NotVeth { ifname: String, driver: String },
    #[error("cannot open the slow path TAP {tap} of {ifname}")]
    Tap {
        ifname: String,
        tap: String,
        #[source]
        source: TapError,
    },
    #[error("{what} for {ifname}: {source}")]
    Setup {
        what: &'static str,
        ifname: String,
        #[source]
        source: io::Error,
    },
}

/// The fast path's maps, shared by every veth port of a switch.
#[derive(Debug)]
pub struct FastPath {
    fdb: Map,
    /// MACs behind remote VTEPs of the VXLAN ports the kernel path covers ([`overlay`]).
    remote: Map,
    counters: Map,
    state: Mutex<SyncState>,
}

/// What [`FastPath::sync`] last put in the map.
#[derive(Debug, Default)]
struct SyncState {
    /// key → (destination ifindex, port).
    entries: HashMap<u64, (u32, u16)>,
    fdb_generation: Option<u64>,
    /// Which ports were in, with which ifindex and access VLAN, at the last sync.
    ports: HashMap<u16, (u32, u16)>,
    last_refresh: u64,
    /// What is in the `remote` map: key → value without the seen word.
    remote: HashMap<u64, [u8; overlay::REMOTE_VALUE]>,
    /// The covered VXLAN ports' receive programs, by port.
    links: HashMap<u16, overlay::RxLink>,
    /// VXLAN ports whose receive program could not be attached, and for what.
    refused: HashMap<u16, overlay::RxKey>,
    /// Remote MACs waiting to enter the `remote` map: key → since when.
    pending: HashMap<u64, u64>,
}

/// How often hit counts are read back into the fdb's ages.
const REFRESH_NS: u64 = 1_000_000_000;

/// The map key of `mac` in `vlan`: the six bytes in wire order as a little-endian number,
/// the VLAN above them, as the program builds it from the frame.
fn key(mac: MacAddr, vlan: u16) -> u64 {
    let m = mac.0;
    u64::from_le_bytes([m[0], m[1], m[2], m[3], m[4], m[5], 0, 0]) | u64::from(vlan) << 48
}

impl FastPath {
    /// Creates the maps (needs `CAP_BPF`), with counters for port ids below `max_ports`.
    pub fn new(max_ports: u32) -> io::Result<FastPath> {
        Ok(FastPath {
            fdb: Map::new(MapKind::Hash, 8, VALUE as u32, FDB_ENTRIES)?,
            remote: Map::new(MapKind::Hash, 8, overlay::REMOTE_VALUE as u32, FDB_ENTRIES)?,
            counters: Map::new(MapKind::PercpuArray, 4, COUNTER as u32, max_ports)?,
            state: Mutex::new(SyncState::default()),
        })
    }

    /// What the fast path forwarded for `port` since the switch started (summed over CPUs).
    pub fn counters(&self, port: PortId) -> FastPathStats {
        let mut c = FastPathStats::default();
        let mut buf = vec![0u8; self.counters.lookup_size()];
        if !matches!(
            self.counters
                .lookup(&u32::from(port.0).to_ne_bytes(), &mut buf),
            Ok(true)
        ) {
            return c;
        }
        let word = |b: &[u8], i: usize| {
            u64::from_ne_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or_default())
        };
        for cpu in buf.chunks_exact(COUNTER) {
            c.rx_packets += word(cpu, 0);
            c.rx_bytes += word(cpu, 1);
            c.tx_packets += word(cpu, 2);
            c.tx_bytes += word(cpu, 3);
            c.drops += word(cpu, 4);
        }
        c
    }

    /// Zeroes `port`'s counters (a new port in a reused slot starts from nothing).
    fn reset_counters(&self, port: PortId) -> io::Result<()> {
        let zero = vec![0u8; self.counters.lookup_size()];
        // A per-CPU update takes one value per possible CPU.
        self.counters
            .update_percpu(&u32::from(port.0).to_ne_bytes(), &zero)
    }

    /// Mirrors the fdb into the map: the addresses learnt on `ports` (port id → (veth
    /// ifindex, access VLAN): the ports whose fast path is on, chosen by the switch), in
    /// their access VLAN; and, every second, refreshes the fdb entries the fast path has
    /// seen frames from. `overlay`: the VXLAN ports the kernel path may cover (their
    /// receive programs and remote MACs: [`overlay`]). Called by the switch's housekeeping
    /// (every 100 ms); cheap when nothing changed.
    pub fn sync(
        &self,
        ports: HashMap<u16, (u32, u16)>,
        overlay: &[OverlayPort],
        fdb: &Fdb,
        now: u64,
    ) {
        let mut st = self.state.lock();
        let st = &mut *st;
        let refresh = now.saturating_sub(st.last_refresh) >= REFRESH_NS;
        if !overlay.is_empty()
            || !st.links.is_empty()
            || !st.remote.is_empty()
            || !st.pending.is_empty()
        {
            self.sync_overlay(st, !ports.is_empty(), overlay, fdb, now, refresh);
        }
        let generation = fdb.generation();
        if st.fdb_generation != Some(generation) || st.ports != ports {
            let mut want: HashMap<u64, (u32, u16)> = HashMap::new();
            for l in fdb.entries(now) {
                let Some(&(ifindex, vlan)) = ports.get(&l.port.0) else {
                    continue;
                };
                if l.vlan == vlan {
                    want.insert(key(l.mac, l.vlan), (ifindex, l.port.0));
                }
            }
            st.entries.retain(|k, v| {
                let keep = want.get(k) == Some(v);
                if !keep {
                    let _ = self.fdb.delete(&k.to_ne_bytes());
                }
                keep
            });
            for (k, (ifindex, port)) in want {
                if st.entries.contains_key(&k) {
                    continue;
                }
                let mut v = [0u8; VALUE];
                v[..4].copy_from_slice(&ifindex.to_ne_bytes());
                v[4..8].copy_from_slice(&u32::from(port).to_ne_bytes());
                if self.fdb.update(&k.to_ne_bytes(), &v).is_ok() {
                    st.entries.insert(k, (ifindex, port));
                }
            }
            st.fdb_generation = Some(generation);
            st.ports = ports;
        }
        if refresh {
            st.last_refresh = now;
            let mut v = [0u8; VALUE];
            for (&k, &(_, port)) in st.entries.iter() {
                if !matches!(self.fdb.lookup(&k.to_ne_bytes(), &mut v), Ok(true)) {
                    continue;
                }
                if v[8..16].iter().all(|&b| b == 0) {
                    continue;
                }
                let b = k.to_le_bytes();
                let mac = MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]]);
                fdb.learn(mac, (k >> 48) as u16, PortId(port), now);
                v[8..16].fill(0);
                let _ = self.fdb.update(&k.to_ne_bytes(), &v);
            }
        }
    }

    /// The program on a veth port's ingress: the fast path for `port` (access VLAN `vlan`),
    /// everything else to the slow path TAP `tap_ifindex`.
    fn ingress_program(&self, port: PortId, vlan: u16, tap_ifindex: u32) -> io::Result<Program> {
        Program::load(
            ProgKind::SchedCls,
            &fast_insns(
                &self.fdb,
                &self.remote,
                &self.counters,
                port,
                vlan,
                tap_ifindex,
            ),
            "qs_veth_fast",
        )
    }
}

/// A forward jump to a label, resolved by [`Asm::finish`].
struct Fixup {
    at: usize,
    label: usize,
}

/// Instructions with forward jumps to labels.
#[derive(Default)]
struct Asm {
    insns: Vec<Insn>,
    fixups: Vec<Fixup>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn push(&mut self, i: Insn) {
        self.insns.push(i);
    }
    fn extend(&mut self, i: impl IntoIterator<Item = Insn>) {
        self.insns.extend(i);
    }
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }
    fn here(&mut self, label: usize) {
        self.labels[label] = Some(self.insns.len());
    }
    /// `if dst op imm goto label`.
    fn jump_imm(&mut self, op: Jmp, dst: u8, imm: i32, label: usize) {
        self.fixups.push(Fixup {
            at: self.insns.len(),
            label,
        });
        self.insns.push(Insn::jump_imm(op, dst, imm, 0));
    }
    /// `if dst op src goto label`.
    fn jump_reg(&mut self, op: Jmp, dst: u8, src: u8, label: usize) {
        self.fixups.push(Fixup {
            at: self.insns.len(),
            label,
        });
        self.insns.push(Insn::jump_reg(op, dst, src, 0));
    }
    /// Builds the map key (see [`key`]) of the MAC at `off` from `base` (the frame's data or
    /// the stack) in `vlan`, in R4 (R5 clobbered), and stores it at `fp + slot`. Every load
    /// is aligned (the stack takes no other): a MAC on a 4-byte boundary is read word then
    /// half-word, one two bytes past it half-word then word.
    fn mac_key(&mut self, base: u8, off: i16, vlan: u16, slot: i16) {
        debug_assert!(off % 2 == 0, "a MAC on a 2-byte boundary");
        if off.rem_euclid(4) == 0 {
            self.push(Insn::load(Size::W, R4, base, off));
            self.push(Insn::load(Size::H, R5, base, off + 4));
            self.push(Insn::alu_imm(Alu::Lsh, R5, 32));
        } else {
            self.push(Insn::load(Size::H, R4, base, off));
            self.push(Insn::load(Size::W, R5, base, off + 2));
            self.push(Insn::alu_imm(Alu::Lsh, R5, 16));
        }
        self.push(Insn::alu_reg(Alu::Or, R4, R5));
        self.extend(Insn::load_imm64(R5, u64::from(vlan) << 48));
        self.push(Insn::alu_reg(Alu::Or, R4, R5));
        self.push(Insn::store(Size::DW, R10, slot, R4));
    }
    /// `R0 = map[fp + slot]`, or `goto miss` when it has no such key.
    fn lookup(&mut self, map: &Map, slot: i16, miss: usize) {
        self.extend(Insn::load_map(R1, map));
        self.push(Insn::mov_reg(R2, R10));
        self.push(Insn::alu_imm(Alu::Add, R2, i32::from(slot)));
        self.push(Insn::call(bpf::FUNC_MAP_LOOKUP_ELEM));
        self.jump_imm(Jmp::Eq, R0, 0, miss);
    }
    fn finish(mut self) -> Vec<Insn> {
        for f in &self.fixups {
            let target = self.labels[f.label].expect("every label placed");
            let off = i16::try_from(target as isize - f.at as isize - 1).expect("short program");
            self.insns[f.at] = self.insns[f.at].with_off(off);
        }
        self.insns
    }
}

/// The fast path program (see the module docs). Registers: R6 the skb, R7 the destination's
/// map value, R8 whether it is a remote one (then [`overlay::encap_insns`] takes over),
/// later the destination ifindex, R9 the destination port.
fn fast_insns(
    fdb: &Map,
    remote: &Map,
    counters: &Map,
    port: PortId,
    vlan: u16,
    tap_ifindex: u32,
) -> Vec<Insn> {
    let me = i32::from(port.0);
    let mut a = Asm::default();
    let slow = a.label();
    let no_rx = a.label();
    let no_tx = a.label();
    a.push(Insn::mov_reg(R6, R1));
    // An untagged Ethernet header in the linear data, or the slow path.
    a.push(Insn::load(Size::W, R2, R6, skb::DATA));
    a.push(Insn::load(Size::W, R3, R6, skb::DATA_END));
    a.push(Insn::mov_reg(R4, R2));
    a.push(Insn::alu_imm(Alu::Add, R4, 14));
    a.jump_reg(Jmp::Gt, R4, R3, slow);
    a.push(Insn::load(Size::W, R4, R6, skb::VLAN_PRESENT));
    a.jump_imm(Jmp::Ne, R4, 0, slow);
    a.push(Insn::load(Size::H, R4, R2, 12));
    a.jump_imm(Jmp::Eq, R4, 0x0081, slow); // 0x8100 read little-endian
    a.jump_imm(Jmp::Eq, R4, 0xa888, slow); // 0x88a8

    // Destination: a group address (broadcast, multicast) floods in the slow path (the
    // key's low byte is the MAC's first).
    a.mac_key(R2, 0, vlan, -8);
    a.push(Insn::mov_reg(R5, R4));
    a.push(Insn::alu_imm(Alu::And, R5, 1));
    a.jump_imm(Jmp::Ne, R5, 0, slow);
    // Source.
    a.mac_key(R2, 6, vlan, -16);
    // The destination must be known: on a fast port (R8 = 0), ...
    let remote_dst = a.label();
    let src = a.label();
    a.lookup(fdb, -8, remote_dst);
    a.push(Insn::mov_reg(R7, R0));
    a.push(Insn::mov_imm(R8, 0));
    a.push(Insn::jump(0));
    let to_src = a.insns.len() - 1;
    // ... or behind a remote VTEP of a VXLAN port the kernel path covers (R8 = 1).
    a.here(remote_dst);
    a.lookup(remote, -8, slow);
    a.push(Insn::mov_reg(R7, R0));
    a.push(Insn::mov_imm(R8, 1));
    a.here(src);
    a.fixups.push(Fixup {
        at: to_src,
        label: src,
    });
    // ... and the source known on this port (else the switch must learn it).
    a.lookup(fdb, -16, slow);
    a.push(Insn::load(Size::W, R1, R0, 4));
    a.jump_imm(Jmp::Ne, R1, me, slow);
    // Seen: the switch refreshes the address's age from this and clears it. Set only when
    // clear, so that the line stays shared between CPUs (a store per frame made every
    // frame of a flow whose packets and ACKs run on two CPUs wait for that line).
    let seen = a.label();
    a.push(Insn::load(Size::DW, R1, R0, 8));
    a.jump_imm(Jmp::Ne, R1, 0, seen);
    a.push(Insn::mov_imm(R1, 1));
    a.push(Insn::store(Size::DW, R0, 8, R1));
    a.here(seen);
    let encap = a.label();
    a.jump_imm(Jmp::Ne, R8, 0, encap);
    a.push(Insn::load(Size::W, R8, R7, 0));
    a.push(Insn::load(Size::W, R9, R7, 4));
    // Never back out of the port it came in on: the switch drops (and counts) that.
    a.jump_imm(Jmp::Eq, R9, me, slow);
    // Counters: rx on this port, tx on the destination.
    a.push(Insn::mov_imm(R1, me));
    a.push(Insn::store(Size::W, R10, -20, R1));
    a.push(Insn::store(Size::W, R10, -24, R9));
    a.lookup(counters, -20, no_rx);
    count(&mut a, 0);
    a.here(no_rx);
    a.lookup(counters, -24, no_tx);
    count(&mut a, 16);
    a.here(no_tx);
    a.push(Insn::mov_reg(R1, R8));
    a.push(Insn::mov_imm(R2, 0));
    a.push(Insn::call(bpf::FUNC_REDIRECT_PEER));
    a.push(Insn::exit());
    a.here(encap);
    overlay::encap_insns(&mut a, counters, me, slow);
    a.here(slow);
    a.push(Insn::mov_imm(R1, tap_ifindex as i32));
    a.push(Insn::mov_imm(R2, 0));
    a.push(Insn::call(bpf::FUNC_REDIRECT));
    a.push(Insn::exit());
    a.finish()
}

/// `packets += 1; bytes += skb->len` for the counter pair at `off` of the value in R0.
fn count(a: &mut Asm, off: i16) {
    a.push(Insn::load(Size::DW, R1, R0, off));
    a.push(Insn::alu_imm(Alu::Add, R1, 1));
    a.push(Insn::store(Size::DW, R0, off, R1));
    a.push(Insn::load(Size::W, R1, R6, skb::LEN));
    a.push(Insn::load(Size::DW, R2, R0, off + 8));
    a.push(Insn::alu_reg(Alu::Add, R2, R1));
    a.push(Insn::store(Size::DW, R0, off + 8, R2));
}

/// A program that sends every frame to `ifindex`'s peer (into its namespace) or, with
/// `peer = false`, out of `ifindex`.
fn redirect_insns(ifindex: u32, peer: bool) -> [Insn; 4] {
    [
        Insn::mov_imm(R1, ifindex as i32),
        Insn::mov_imm(R2, 0),
        Insn::call(if peer {
            bpf::FUNC_REDIRECT_PEER
        } else {
            bpf::FUNC_REDIRECT
        }),
        Insn::exit(),
    ]
}

/// The slow path TAP's egress: only what the veth's ingress program redirected to it
/// (received on `veth_ifindex`) may reach qswitch; anything the host's own stack would send
/// through the TAP (IPv6 router solicitations, duplicate address detection) is dropped, so
/// that nothing the host says is taken for the namespace's.
fn tap_egress_insns(veth_ifindex: u32) -> [Insn; 5] {
    [
        Insn::load(Size::W, R2, R1, skb::INGRESS_IFINDEX),
        Insn::mov_imm(R0, bpf::TC_ACT_OK),
        Insn::jump_imm(Jmp::Eq, R2, veth_ifindex as i32, 1),
        Insn::mov_imm(R0, bpf::TC_ACT_SHOT),
        Insn::exit(),
    ]
}

/// A veth port (see the module docs).
#[derive(Debug)]
pub struct VethPort {
    ifname: String,
    ifindex: u32,
    /// The slow path.
    tap: TapPort,
    /// Whether the fast path was asked for (`fastpath`); whether it is on right now also
    /// depends on the port's policy (the switch's veth driver).
    fast: bool,
    _links: Vec<Link>,
}

/// The slow path TAP's name for the veth with `ifindex`.
pub fn tap_name(ifindex: u32) -> String {
    format!("qsv{ifindex}")
}

impl VethPort {
    /// Attaches to the root-namespace end `ifname` of a veth pair as port `port` (access
    /// VLAN `vlan`, 0 for none): opens the slow path TAP with `queues` queues and attaches
    /// the programs; with `fast`, the fast path program using `fp`'s maps.
    pub fn open(
        port: PortId,
        ifname: &str,
        queues: u16,
        vlan: u16,
        fast: Option<&FastPath>,
    ) -> Result<VethPort, VethError> {
        if !qswitch_sys::netif::exists(ifname) {
            return Err(VethError::NoSuchInterface(ifname.to_string()));
        }
        let bpf_err = |what| {
            let ifname = ifname.to_string();
            move |source| VethError::Setup {
                what,
                ifname,
                source,
            }
        };
        // An interface without ethtool driver info (lo, for one) is no veth either.
        let driver = qswitch_sys::xdp::driver(ifname).unwrap_or_else(|_| "none reported".into());
        if driver != "veth" {
            return Err(VethError::NotVeth {
                ifname: ifname.to_string(),
                driver,
            });
        }
        let ifindex = qswitch_sys::xdp::ifindex(ifname).map_err(bpf_err("reading the ifindex"))?;
        let tap_if = tap_name(ifindex);
        // Down until its programs are on (docs/veth.md: cheaper so).
        let tap =
            TapPort::open_internal_down(&tap_if, queues).map_err(|source| VethError::Tap {
                ifname: ifname.to_string(),
                tap: tap_if.clone(),
                source,
            })?;
        let tap_ifindex =
            qswitch_sys::xdp::ifindex(&tap_if).map_err(bpf_err("reading the TAP's ifindex"))?;
        if let Some(fp) = fast {
            if let Err(e) = fp.reset_counters(port) {
                tracing::warn!(port = %port, error = %e, "cannot reset fast path counters");
            }
        }
        let out = Program::load(
            ProgKind::SchedCls,
            &redirect_insns(ifindex, true),
            "qs_veth_out",
        )
        .map_err(bpf_err("loading the slow path's program"))?;
        let guard = Program::load(
            ProgKind::SchedCls,
            &tap_egress_insns(ifindex),
            "qs_veth_guard",
        )
        .map_err(bpf_err("loading the slow path's guard"))?;
        let into = match fast {
            Some(fp) => fp.ingress_program(port, vlan, tap_ifindex),
            None => Program::load(
                ProgKind::SchedCls,
                &redirect_insns(tap_ifindex, false),
                "qs_veth_slow",
            ),
        }
        .map_err(bpf_err("loading the ingress program"))?;
        // The TAP's two programs are classic tc filters where the TAP goes with the process
        // (taking them along): that spares the two RCU grace periods of tcx links (docs/
        // veth.md). Its qdisc now, while the TAP is down, its filters after the grace period
        // the veth's link waits for (so that they wait for none).
        let classic = tap.created()
            && bpf::tc_clsact(tap_ifindex)
                .inspect_err(|e| {
                    tracing::debug!(%ifname, error = %e, "no classic tc on the slow path TAP");
                })
                .is_ok();
        // The way in first: into the TAP, which drops what it is sent while it is down. The
        // root end's program is a tcx link: it must go with the process, and the veth does
        // not.
        let mut links = vec![bpf::tcx_attach(&into, ifindex, TcHook::Ingress)
            .map_err(bpf_err("attaching to the veth's ingress"))?];
        // The slow path's way back to the namespace, and its guard.
        let tap_progs = [
            (&out, TcHook::Ingress, "qs_veth_out"),
            (&guard, TcHook::Egress, "qs_veth_guard"),
        ];
        let classic = classic
            && bpf::tc_attach_classic(tap_ifindex, &tap_progs)
                .inspect_err(|e| {
                    tracing::debug!(%ifname, error = %e, "no classic tc on the slow path TAP");
                })
                .is_ok();
        if !classic {
            for (prog, hook, _) in tap_progs {
                links.push(
                    bpf::tcx_attach(prog, tap_ifindex, hook)
                        .map_err(bpf_err("attaching to the slow path TAP"))?,
                );
            }
        }
        qswitch_sys::netif::set_up(&tap_if, true)
            .map_err(bpf_err("bringing the slow path TAP up"))?;
        // No door into the host (audit F2): no addresses, no link-local ever, no ARP answers,
        // before it is up; and down again when the port goes ([`Drop`]).
        qswitch_sys::netif::seal(ifname)
            .map_err(bpf_err("taking the host's stack off the veth"))?;
        qswitch_sys::netif::set_up(ifname, true).map_err(bpf_err("bringing the veth up"))?;
        Ok(VethPort {
            ifname: ifname.to_string(),
            ifindex,
            tap,
            fast: fast.is_some(),
            _links: links,
        })
    }

    /// The veth end's name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The slow path TAP.
    pub fn tap(&self) -> &TapPort {
        &self.tap
    }

    /// Whether the fast path was asked for.
    pub fn fastpath(&self) -> bool {
        self.fast
    }

    /// The veth end's ifindex.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }
}

impl Drop for VethPort {
    /// Sets the root end down: with the programs gone, frames from the namespace would reach
    /// the host's own stack (an interface deleted meanwhile, or renamed, is left alone).
    fn drop(&mut self) {
        if qswitch_sys::xdp::ifindex(&self.ifname).ok() == Some(self.ifindex) {
            if let Err(e) = qswitch_sys::netif::set_up(&self.ifname, false) {
                tracing::warn!(ifname = %self.ifname, error = %e, "cannot set the veth down");
            }
        }
    }
}

impl Port for VethPort {
    #[inline]
    fn rx_burst(&self, queue: u16, pkts: &mut [Pkt], now: u64, drops: &mut DropTally) -> usize {
        self.tap.rx_burst(queue, pkts, now, drops)
    }
    #[inline]
    fn tx_burst(
        &self,
        worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        drops: &mut DropTally,
    ) -> TxDone {
        self.tap.tx_burst(worker, pkts, sel, drops)
    }
    fn rx_fd(&self, queue: u16) -> Option<std::os::fd::RawFd> {
        self.tap.rx_fd(queue)
    }
    fn rx_dead(&self, queue: u16) -> bool {
        self.tap.rx_dead(queue)
    }
    fn offloads(&self) -> Vec<&'static str> {
        self.tap.offloads()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qswitch_test_support::root_or_skip;

    #[test]
    fn keys_are_built_as_the_program_builds_them() {
        let mac = MacAddr([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
        // The program loads bytes 0..4 and 4..6 little-endian and puts the VLAN above.
        let lo = u32::from_le_bytes([0x02, 0x11, 0x22, 0x33]);
        let hi = u16::from_le_bytes([0x44, 0x55]);
        assert_eq!(
            key(mac, 10),
            u64::from(lo) | u64::from(hi) << 32 | 10u64 << 48
        );
        // The source half: bytes 6..8 then 8..12 shifted by 16.
        let frame = [0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        let s = u64::from(u16::from_le_bytes([frame[6], frame[7]]))
            | u64::from(u32::from_le_bytes([
                frame[8], frame[9], frame[10], frame[11],
            ])) << 16;
        assert_eq!(s | 10u64 << 48, key(mac, 10));
    }

    #[test]
    fn the_verifier_accepts_the_programs() {
        if !root_or_skip() {
            return;
        }
        let fp = FastPath::new(4096).unwrap();
        for vlan in [0, 10, 4094] {
            let p = fp.ingress_program(PortId(7), vlan, 3);
            assert!(p.is_ok(), "{p:?}");
        }
        for peer in [true, false] {
            let p = Program::load(ProgKind::SchedCls, &redirect_insns(3, peer), "t");
            assert!(p.is_ok(), "{p:?}");
        }
        let p = Program::load(ProgKind::SchedCls, &tap_egress_insns(3), "t");
        assert!(p.is_ok(), "{p:?}");
        assert_eq!(fp.counters(PortId(7)), FastPathStats::default());
        fp.reset_counters(PortId(7)).unwrap();
    }
}
