//! veth ports across hosts in the kernel: VXLAN encapsulation and decapsulation by the fast
//! path's programs, with no vxlan device (docs/overlay.md, "veth ports across hosts").
//!
//! ```text
//!  netns A   qs-a ─tcx ingress (fast path): dst MAC in `remote` (learnt behind a VTEP of
//!                  a covered VXLAN port), src MAC learnt on qs-a, IPv4 or IPv6 inside
//!                  ─▶ bpf_skb_adjust_room(+50, ENCAP_L3_IPV4 | ENCAP_L4_UDP | ENCAP_L2_ETH)
//!                  ─▶ outer IPv4/UDP(dstport)/VXLAN(VNI) written ─▶ bpf_redirect_neigh(underlay)
//!  underlay ─tcx ingress: IPv4/UDP to (local, dstport), this VNI, inner dst MAC on a fast
//!                  veth port, inner src MAC in `remote` behind the outer source address
//!                  ─▶ bpf_skb_adjust_room(-50, DECAP_L3_*) ─▶ inner Ethernet header
//!                  ─▶ bpf_redirect_peer(veth) ─▶ netns
//!            anything else: TCX_NEXT (the next program, then the stack: the VXLAN port's
//!                  socket, as without this)
//! ```
//!
//! The `remote` map, (VLAN, MAC) → (VTEP, local address, VNI, underlay ifindex, VXLAN
//! port, dstport, seen), mirrors the switch's fdb entries on covered VXLAN ports with the
//! VTEP the port's remote table gives; a MAC that moves (to another VTEP, or to a local
//! port) or ages out leaves the map at the next sync (100 ms), and its frames go back to
//! the workers. The receive program takes only frames whose inner source the switch already
//! has behind that very VTEP: such a frame would teach the switch nothing, so learning and
//! the underlay's trust rules (docs/overlay.md, "Learning") stay the VXLAN port's.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use qswitch_sys::bpf::{
    self, adj_room, skb, Alu, Insn, Jmp, Link, Map, ProgKind, Program, Size, TcHook, R0, R1, R10,
    R2, R3, R4, R5, R6, R7, R8, R9,
};
use qswitch_wire::mac::MacAddr;

use super::{key, Asm, FastPath, SyncState};
use crate::fdb::Fdb;
use crate::ids::PortId;
use crate::port::vxlan::VxlanPort;

/// Bytes of a `remote` value: VTEP (0), local address (4), VXLAN header's second word (8),
/// underlay ifindex (12), VXLAN port (16), dstport (20, wire order in the low half), seen
/// (24, u64: set by the receive program, cleared by the refresh).
pub(super) const REMOTE_VALUE: usize = 32;
/// Outer headers: IPv4 (20), UDP (8), VXLAN (8), and the inner Ethernet header (14).
const ENCAP: i32 = 50;
/// How long a remote MAC is known before the kernel path sends to it (see
/// [`FastPath::sync_overlay`]).
const HOLD_NS: u64 = 300_000_000;
/// Offset of the drop counter in a counter value.
const DROPS: i16 = 32;

/// A VXLAN port the kernel path may cover, as the switch hands it to [`FastPath::sync`]:
/// an access port (VLAN `vlan`) with no per-frame policy (the veth rules, docs/veth.md).
#[derive(Debug, Clone)]
pub struct OverlayPort {
    pub port: PortId,
    pub vlan: u16,
    pub vxlan: Arc<VxlanPort>,
}

/// What a receive program was built for; a change rebuilds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RxKey {
    vlan: u16,
    vni: u32,
    local: Ipv4Addr,
    dstport: u16,
    underlay: u32,
}

/// A covered VXLAN port's receive program on its underlay interface.
#[derive(Debug)]
pub(super) struct RxLink {
    key: RxKey,
    vxlan: Arc<VxlanPort>,
    _link: Link,
}

/// The VXLAN header's second word as the program stores it: the VNI's three bytes in wire
/// order, then the reserved byte.
fn vni_word(vni: u32) -> u32 {
    u32::from_le_bytes([(vni >> 16) as u8, (vni >> 8) as u8, vni as u8, 0])
}

/// A `remote` value without its seen word.
fn remote_value(vtep: Ipv4Addr, k: &RxKey, port: PortId) -> [u8; REMOTE_VALUE] {
    let mut v = [0u8; REMOTE_VALUE];
    v[0..4].copy_from_slice(&vtep.octets());
    v[4..8].copy_from_slice(&k.local.octets());
    v[8..12].copy_from_slice(&vni_word(k.vni).to_ne_bytes());
    v[12..16].copy_from_slice(&k.underlay.to_ne_bytes());
    v[16..20].copy_from_slice(&u32::from(port.0).to_ne_bytes());
    v[20..22].copy_from_slice(&k.dstport.to_be_bytes());
    v
}

/// The encapsulation, at the end of the fast path program (see [`super::fast_insns`]):
/// entered with R6 the skb, R7 the destination's `remote` value, the source checked.
pub(super) fn encap_insns(a: &mut Asm, counters: &Map, me: i32, slow: usize) {
    let drop = a.label();
    let ip = a.label();
    // An Ethernet header in the linear data, IPv4 or IPv6 inside (bpf_skb_adjust_room
    // takes nothing else).
    a.push(Insn::load(Size::W, R2, R6, skb::DATA));
    a.push(Insn::load(Size::W, R3, R6, skb::DATA_END));
    a.push(Insn::mov_reg(R4, R2));
    a.push(Insn::alu_imm(Alu::Add, R4, 14));
    a.jump_reg(Jmp::Gt, R4, R3, slow);
    a.push(Insn::load(Size::H, R4, R2, 12));
    a.jump_imm(Jmp::Eq, R4, 0x0008, ip); // 0x0800 read little-endian
    a.jump_imm(Jmp::Ne, R4, 0xdd86, slow); // 0x86dd
    a.here(ip);
    // The headers to insert, built at fp-120..fp-70: IPv4 (-120), UDP (-100), VXLAN (-92),
    // the inner Ethernet header (-84: a copy of the frame's).
    for (from, to) in [(0, -84), (4, -80), (8, -76)] {
        a.push(Insn::load(Size::W, R4, R2, from));
        a.push(Insn::store(Size::W, R10, to, R4));
    }
    a.push(Insn::load(Size::H, R4, R2, 12));
    a.push(Insn::store(Size::H, R10, -72, R4));
    a.push(Insn::load(Size::W, R8, R6, skb::LEN));
    // UDP source port from the inner flow's hash, in 49152-65535 (RFC 7348 section 5).
    a.push(Insn::mov_reg(R1, R6));
    a.push(Insn::call(bpf::FUNC_GET_HASH_RECALC));
    a.push(Insn::mov_reg(R9, R0));
    a.push(Insn::alu_imm(Alu::Rsh, R9, 16));
    a.push(Insn::alu_reg(Alu::Xor, R9, R0));
    a.push(Insn::alu_imm(Alu::And, R9, 0x3fff));
    a.push(Insn::alu_imm(Alu::Or, R9, 0xc000));
    a.push(Insn::to_be16(R9));
    // UDP: source, destination port; length, checksum 0 (allowed over IPv4, as Linux's
    // vxlan sends it).
    a.push(Insn::load(Size::W, R4, R7, 20));
    a.push(Insn::alu_imm(Alu::Lsh, R4, 16));
    a.push(Insn::alu_reg(Alu::Or, R4, R9));
    a.push(Insn::store(Size::W, R10, -100, R4));
    a.push(Insn::mov_reg(R4, R8));
    a.push(Insn::alu_imm(Alu::Add, R4, ENCAP - 34));
    a.push(Insn::to_be16(R4));
    a.push(Insn::store(Size::W, R10, -96, R4));
    // VXLAN: flags (I), VNI.
    a.push(Insn::mov_imm(R4, 0x08));
    a.push(Insn::store(Size::W, R10, -92, R4));
    a.push(Insn::load(Size::W, R4, R7, 8));
    a.push(Insn::store(Size::W, R10, -88, R4));
    // IPv4: version 4, IHL 5, total length; ID 0, DF; TTL 64, UDP, checksum; source, VTEP.
    a.push(Insn::mov_reg(R4, R8));
    a.push(Insn::alu_imm(Alu::Add, R4, ENCAP - 14));
    a.push(Insn::to_be16(R4));
    a.push(Insn::alu_imm(Alu::Lsh, R4, 16));
    a.push(Insn::alu_imm(Alu::Or, R4, 0x45));
    a.push(Insn::store(Size::W, R10, -120, R4));
    a.push(Insn::mov_imm(R4, 0x0040_0000));
    a.push(Insn::store(Size::W, R10, -116, R4));
    a.push(Insn::mov_imm(R4, 0x1140));
    a.push(Insn::store(Size::W, R10, -112, R4));
    a.push(Insn::load(Size::W, R4, R7, 4));
    a.push(Insn::store(Size::W, R10, -108, R4));
    a.push(Insn::load(Size::W, R4, R7, 0));
    a.push(Insn::store(Size::W, R10, -104, R4));
    a.push(Insn::mov_imm(R1, 0));
    a.push(Insn::mov_imm(R2, 0));
    a.push(Insn::mov_reg(R3, R10));
    a.push(Insn::alu_imm(Alu::Add, R3, -120));
    a.push(Insn::mov_imm(R4, 20));
    a.push(Insn::mov_imm(R5, 0));
    a.push(Insn::call(bpf::FUNC_CSUM_DIFF));
    for _ in 0..2 {
        a.push(Insn::mov_reg(R1, R0));
        a.push(Insn::alu_imm(Alu::Rsh, R1, 16));
        a.push(Insn::alu_imm(Alu::And, R0, 0xffff));
        a.push(Insn::alu_reg(Alu::Add, R0, R1));
    }
    a.push(Insn::alu_imm(Alu::Xor, R0, 0xffff));
    a.push(Insn::alu_imm(Alu::And, R0, 0xffff));
    a.push(Insn::alu_imm(Alu::Lsh, R0, 16));
    a.push(Insn::alu_imm(Alu::Or, R0, 0x1140));
    a.push(Insn::store(Size::W, R10, -112, R0));
    // Room after the Ethernet header (which becomes the outer one); the sender's segment
    // size stays (the VMs' MTU is the inner MTU, as on the slow path).
    a.push(Insn::mov_reg(R1, R6));
    a.push(Insn::mov_imm(R2, ENCAP));
    a.push(Insn::mov_imm(R3, adj_room::MODE_MAC));
    a.extend(Insn::load_imm64(
        R4,
        adj_room::FIXED_GSO
            | adj_room::ENCAP_L3_IPV4
            | adj_room::ENCAP_L4_UDP
            | adj_room::ENCAP_L2_ETH
            | adj_room::encap_l2(14),
    ));
    a.push(Insn::call(bpf::FUNC_SKB_ADJUST_ROOM));
    a.jump_imm(Jmp::Ne, R0, 0, slow); // unchanged when refused
    a.push(Insn::mov_reg(R1, R6));
    a.push(Insn::mov_imm(R2, 14));
    a.push(Insn::mov_reg(R3, R10));
    a.push(Insn::alu_imm(Alu::Add, R3, -120));
    a.push(Insn::mov_imm(R4, ENCAP));
    a.push(Insn::mov_imm(R5, 0));
    a.push(Insn::call(bpf::FUNC_SKB_STORE_BYTES));
    a.jump_imm(Jmp::Ne, R0, 0, drop);
    // Never fragmented: a datagram (or a segment of a GSO packet) that does not fit the
    // underlay is dropped and counted, as the VXLAN port's `mtu_exceeded`.
    a.push(Insn::mov_imm(R1, 0));
    a.push(Insn::store(Size::W, R10, -124, R1));
    a.push(Insn::mov_reg(R1, R6));
    a.push(Insn::load(Size::W, R2, R7, 12));
    a.push(Insn::mov_reg(R3, R10));
    a.push(Insn::alu_imm(Alu::Add, R3, -124));
    a.push(Insn::mov_imm(R4, 0));
    a.push(Insn::mov_imm(R5, bpf::MTU_CHK_SEGS));
    a.push(Insn::call(bpf::FUNC_CHECK_MTU));
    a.jump_imm(Jmp::Ne, R0, 0, drop);
    // Counters: rx on this port, tx on the VXLAN port, the inner frame's bytes.
    counter(a, counters, Insn::mov_imm(R1, me), 0, Some(R8));
    counter(a, counters, vxlan_port(), 16, Some(R8));
    a.push(Insn::load(Size::W, R1, R7, 12));
    a.push(Insn::mov_imm(R2, 0));
    a.push(Insn::mov_imm(R3, 0));
    a.push(Insn::mov_imm(R4, 0));
    a.push(Insn::call(bpf::FUNC_REDIRECT_NEIGH));
    a.push(Insn::exit());
    a.here(drop);
    counter(a, counters, vxlan_port(), DROPS, None);
    a.push(Insn::mov_imm(R0, bpf::TC_ACT_SHOT));
    a.push(Insn::exit());
}

/// Counts one frame on the counter value of the port `port` puts in R1 at `off`: packets,
/// and with `bytes` the bytes in that register.
fn counter(a: &mut Asm, counters: &Map, port: Insn, off: i16, bytes: Option<u8>) {
    let done = a.label();
    a.push(port);
    a.push(Insn::store(Size::W, R10, -20, R1));
    a.lookup(counters, -20, done);
    a.push(Insn::load(Size::DW, R1, R0, off));
    a.push(Insn::alu_imm(Alu::Add, R1, 1));
    a.push(Insn::store(Size::DW, R0, off, R1));
    if let Some(r) = bytes {
        a.push(Insn::load(Size::DW, R2, R0, off + 8));
        a.push(Insn::alu_reg(Alu::Add, R2, r));
        a.push(Insn::store(Size::DW, R0, off + 8, R2));
    }
    a.here(done);
}

/// Puts the VXLAN port of R7's `remote` value (its word at 16) in R1.
fn vxlan_port() -> Insn {
    Insn::load(Size::W, R1, R7, 16)
}

/// The receive program of VXLAN port `port` (see the module docs). Registers: R6 the skb,
/// R7 the destination veth's ifindex, R8 its port, R9 the outer source address.
fn decap_insns(fp: &FastPath, port: PortId, k: &RxKey) -> Vec<Insn> {
    let me = i32::from(port.0);
    let mut a = Asm::default();
    let next = a.label();
    let v4 = a.label();
    let go = a.label();
    a.push(Insn::mov_reg(R6, R1));
    // The first 64 bytes (outer Ethernet, IPv4, UDP, VXLAN, inner Ethernet) to fp-66.
    a.push(Insn::mov_reg(R1, R6));
    a.push(Insn::mov_imm(R2, 0));
    a.push(Insn::mov_reg(R3, R10));
    a.push(Insn::alu_imm(Alu::Add, R3, -66));
    a.push(Insn::mov_imm(R4, 64));
    a.push(Insn::call(bpf::FUNC_SKB_LOAD_BYTES));
    a.jump_imm(Jmp::Ne, R0, 0, next);
    let at = |off: i16| -66 + off;
    // IPv4 without options, UDP, not a fragment, to the local address and dstport.
    a.push(Insn::load(Size::H, R4, R10, at(12)));
    a.jump_imm(Jmp::Ne, R4, 0x0008, next);
    a.push(Insn::load(Size::B, R4, R10, at(14)));
    a.jump_imm(Jmp::Ne, R4, 0x45, next);
    a.push(Insn::load(Size::B, R4, R10, at(23)));
    a.jump_imm(Jmp::Ne, R4, 17, next);
    a.push(Insn::load(Size::H, R4, R10, at(20)));
    a.push(Insn::alu_imm(Alu::And, R4, 0xff3f)); // MF and the offset, little-endian
    a.jump_imm(Jmp::Ne, R4, 0, next);
    a.push(Insn::load(Size::W, R4, R10, at(30)));
    a.extend(Insn::load_imm64(
        R5,
        u64::from(u32::from_ne_bytes(k.local.octets())),
    ));
    a.jump_reg(Jmp::Ne, R4, R5, next);
    a.push(Insn::load(Size::H, R4, R10, at(36)));
    a.jump_imm(
        Jmp::Ne,
        R4,
        i32::from(u16::from_ne_bytes(k.dstport.to_be_bytes())),
        next,
    );
    // VXLAN: flags I only, this VNI, reserved bits zero.
    a.push(Insn::load(Size::W, R4, R10, at(42)));
    a.jump_imm(Jmp::Ne, R4, 0x08, next);
    a.push(Insn::load(Size::W, R4, R10, at(46)));
    a.jump_imm(Jmp::Ne, R4, vni_word(k.vni) as i32, next);
    a.push(Insn::load(Size::W, R9, R10, at(26)));
    // The inner destination on a fast veth port of this VLAN.
    a.mac_key(R10, at(50), k.vlan, -80);
    a.lookup(&fp.fdb, -80, next);
    a.push(Insn::load(Size::W, R7, R0, 0));
    a.push(Insn::load(Size::W, R8, R0, 4));
    // The inner source known behind this very VTEP, on this port.
    a.mac_key(R10, at(56), k.vlan, -88);
    a.lookup(&fp.remote, -88, next);
    a.push(Insn::load(Size::W, R1, R0, 0));
    a.jump_reg(Jmp::Ne, R1, R9, next);
    a.push(Insn::load(Size::W, R1, R0, 16));
    a.jump_imm(Jmp::Ne, R1, me, next);
    let seen = a.label();
    a.push(Insn::load(Size::DW, R1, R0, 24));
    a.jump_imm(Jmp::Ne, R1, 0, seen);
    a.push(Insn::mov_imm(R1, 1));
    a.push(Insn::store(Size::DW, R0, 24, R1));
    a.here(seen);
    // IPv4 or IPv6 inside (what bpf_skb_adjust_room takes).
    a.push(Insn::load(Size::H, R1, R10, at(62)));
    a.jump_imm(Jmp::Eq, R1, 0x0008, v4);
    a.jump_imm(Jmp::Ne, R1, 0xdd86, next);
    a.push(Insn::mov_imm(R4, adj_room::DECAP_L3_IPV6 as i32));
    a.push(Insn::jump(0));
    let to_go = a.insns.len() - 1;
    a.here(v4);
    a.push(Insn::mov_imm(R4, adj_room::DECAP_L3_IPV4 as i32));
    a.here(go);
    a.fixups.push(super::Fixup {
        at: to_go,
        label: go,
    });
    a.push(Insn::mov_reg(R1, R6));
    a.push(Insn::mov_imm(R2, -ENCAP));
    a.push(Insn::mov_imm(R3, adj_room::MODE_MAC));
    a.push(Insn::call(bpf::FUNC_SKB_ADJUST_ROOM));
    a.jump_imm(Jmp::Ne, R0, 0, next); // unchanged when refused
                                      // The outer Ethernet header stayed: the inner one over it.
    a.push(Insn::mov_reg(R1, R6));
    a.push(Insn::mov_imm(R2, 0));
    a.push(Insn::mov_reg(R3, R10));
    a.push(Insn::alu_imm(Alu::Add, R3, at(50) as i32));
    a.push(Insn::mov_imm(R4, 14));
    a.push(Insn::mov_imm(R5, 0));
    a.push(Insn::call(bpf::FUNC_SKB_STORE_BYTES));
    let shot = a.label();
    a.jump_imm(Jmp::Ne, R0, 0, shot);
    a.push(Insn::load(Size::W, R9, R6, skb::LEN));
    // Counters: rx on the VXLAN port, tx on the veth port.
    counter(&mut a, &fp.counters, Insn::mov_imm(R1, me), 0, Some(R9));
    counter(&mut a, &fp.counters, Insn::mov_reg(R1, R8), 16, Some(R9));
    a.push(Insn::mov_reg(R1, R7));
    a.push(Insn::mov_imm(R2, 0));
    a.push(Insn::call(bpf::FUNC_REDIRECT_PEER));
    a.push(Insn::exit());
    a.here(shot);
    a.push(Insn::mov_imm(R0, bpf::TC_ACT_SHOT));
    a.push(Insn::exit());
    a.here(next);
    a.push(Insn::mov_imm(R0, bpf::TCX_NEXT));
    a.push(Insn::exit());
    a.finish()
}

impl FastPath {
    /// Loads the receive program of VXLAN port `port` for `k`.
    fn decap_program(&self, port: PortId, k: &RxKey) -> std::io::Result<Program> {
        Program::load(
            ProgKind::SchedCls,
            &decap_insns(self, port, k),
            "qs_vxlan_decap",
        )
    }

    /// The overlay half of [`FastPath::sync`]: attaches (or keeps, or drops) the receive
    /// program of each of `overlay` (only while some veth port is on the fast path:
    /// `veth`), and mirrors into `remote` the fdb's entries on those ports with their
    /// VTEPs; every second (`refresh`) it refreshes the entries the receive programs saw
    /// frames from, in the fdb and in the VXLAN port's remote table.
    pub(super) fn sync_overlay(
        &self,
        st: &mut SyncState,
        veth: bool,
        overlay: &[OverlayPort],
        fdb: &Fdb,
        now: u64,
        refresh: bool,
    ) {
        let mut keep: HashMap<u16, RxKey> = HashMap::new();
        if veth {
            for o in overlay {
                let IpAddr::V4(local) = o.vxlan.local() else {
                    continue;
                };
                let underlay = match st.links.get(&o.port.0) {
                    Some(l) if l.key.local == local => Some(l.key.underlay),
                    _ => match qswitch_sys::netif::holding_ipv4(local) {
                        Ok(u) => u.map(|(_, ifindex)| ifindex),
                        Err(e) => {
                            tracing::debug!(port = %o.port, error = %e, "no underlay interface");
                            None
                        }
                    },
                };
                let Some(underlay) = underlay else {
                    continue;
                };
                keep.insert(
                    o.port.0,
                    RxKey {
                        vlan: o.vlan,
                        vni: o.vxlan.vni(),
                        local,
                        dstport: o.vxlan.dstport(),
                        underlay,
                    },
                );
            }
        }
        st.links.retain(|p, l| keep.get(p) == Some(&l.key));
        st.refused.retain(|p, k| keep.get(p) == Some(k));
        for o in overlay {
            let Some(k) = keep.get(&o.port.0) else {
                continue;
            };
            if st.links.contains_key(&o.port.0) || st.refused.get(&o.port.0) == Some(k) {
                continue;
            }
            let attached = self
                .decap_program(o.port, k)
                .and_then(|p| bpf::tcx_attach(&p, k.underlay, TcHook::Ingress));
            match attached {
                Ok(link) => {
                    tracing::info!(port = %o.port, underlay = k.underlay, "VXLAN port: kernel path for veth ports on");
                    st.links.insert(
                        o.port.0,
                        RxLink {
                            key: *k,
                            vxlan: o.vxlan.clone(),
                            _link: link,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(port = %o.port, error = %e, "VXLAN port: no kernel path for veth ports");
                    // Not retried every 100 ms: only once what it is built for changes.
                    st.refused.insert(o.port.0, *k);
                }
            }
        }
        // The remote MACs of the ports with a receive program.
        let mut want: HashMap<u64, [u8; REMOTE_VALUE]> = HashMap::new();
        if !st.links.is_empty() {
            for l in fdb.entries(now) {
                let Some(link) = st.links.get(&l.port.0) else {
                    continue;
                };
                if l.vlan != link.key.vlan || l.mac.0[0] & 1 != 0 {
                    continue;
                }
                if let Some(IpAddr::V4(vtep)) = link.vxlan.lookup(l.mac) {
                    want.insert(key(l.mac, l.vlan), remote_value(vtep, &link.key, l.port));
                }
            }
        }
        st.remote.retain(|k, v| {
            let keep = want.get(k) == Some(v);
            if !keep {
                let _ = self.remote.delete(&k.to_ne_bytes());
            }
            keep
        });
        // A new entry waits [`HOLD_NS`] before the kernel takes it: the peer learnt this
        // host's MAC before it answered (which taught this host its MAC), and its own sync
        // (100 ms) should put that MAC in its `remote` map before kernel-path frames reach
        // it; else, over an underlay that carries GSO packets whole (a veth), they would
        // reach its socket unsegmented.
        st.pending.retain(|k, _| want.contains_key(k));
        for (k, v) in want {
            if st.remote.contains_key(&k) {
                continue;
            }
            let since = *st.pending.entry(k).or_insert(now);
            if now.saturating_sub(since) < HOLD_NS {
                continue;
            }
            if self.remote.update(&k.to_ne_bytes(), &v).is_ok() {
                st.remote.insert(k, v);
                st.pending.remove(&k);
            }
        }
        if refresh {
            let mut v = [0u8; REMOTE_VALUE];
            for (&k, val) in st.remote.iter() {
                if !matches!(self.remote.lookup(&k.to_ne_bytes(), &mut v), Ok(true))
                    || v[24..32].iter().all(|&b| b == 0)
                {
                    continue;
                }
                let b = k.to_le_bytes();
                let mac = MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]]);
                let port = u16::from_ne_bytes([val[16], val[17]]);
                let vtep = Ipv4Addr::new(val[0], val[1], val[2], val[3]);
                fdb.learn(mac, (k >> 48) as u16, PortId(port), now);
                if let Some(l) = st.links.get(&port) {
                    l.vxlan.refresh(mac, IpAddr::V4(vtep));
                }
                v[24..32].fill(0);
                let _ = self.remote.update(&k.to_ne_bytes(), &v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qswitch_test_support::root_or_skip;

    #[test]
    fn vni_words_are_the_header_bytes() {
        assert_eq!(vni_word(100).to_le_bytes(), [0, 0, 100, 0]);
        assert_eq!(vni_word(0x12_3456).to_le_bytes(), [0x12, 0x34, 0x56, 0]);
    }

    #[test]
    fn the_verifier_accepts_the_decap_program() {
        if !root_or_skip() {
            return;
        }
        let fp = FastPath::new(4096).unwrap();
        for (vlan, vni, local) in [(0, 100, [10, 0, 0, 1]), (4094, 0xff_ffff, [200, 1, 2, 250])] {
            let k = RxKey {
                vlan,
                vni,
                local: Ipv4Addr::from(local),
                dstport: 4789,
                underlay: 1,
            };
            let p = fp.decap_program(PortId(9), &k);
            assert!(p.is_ok(), "{p:?}");
        }
    }
}
