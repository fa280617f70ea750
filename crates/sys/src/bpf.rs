//! `bpf(2)` with no BPF toolchain: maps, programs from hand-written instructions, and tcx
//! links (the tc hooks a BPF link owns).
//!
//! The XDP redirect program of [`crate::xdp`] and the kernel fast path of qswitch's veth
//! ports are both a few dozen instructions, built with [`Insn`]'s constructors and loaded
//! with [`Program::load`]. A program is attached through a BPF link ([`tcx_attach`],
//! [`crate::xdp::attach`]) that belongs to this process: when the process exits, even by
//! `kill -9`, the kernel detaches the program. Nothing is pinned in bpffs. The one
//! exception, [`tc_attach_classic`] (a classic tc filter, much cheaper to attach), is only
//! for interfaces that go with the process themselves.
//!
//! Why by hand and not a crate: `aya` and `libbpf-rs` load ELF objects that a BPF compiler
//! (clang) produced at build time, which the project does not want to require; the programs
//! here are small enough to read as instructions, and each one has a test that the
//! kernel's verifier accepts it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::{cvt, owned};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

/// `enum bpf_attach_type`: the tcx hooks (Linux 6.6).
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// `union bpf_attr`, as a byte buffer large enough for every command used here (the kernel
/// checks that bytes past what it knows are zero).
#[repr(C, align(8))]
pub(crate) struct BpfAttr(pub(crate) [u8; 128]);

impl BpfAttr {
    pub(crate) fn new() -> BpfAttr {
        BpfAttr([0; 128])
    }
    pub(crate) fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    pub(crate) fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

pub(crate) fn bpf(cmd: libc::c_long, attr: &mut BpfAttr) -> io::Result<libc::c_int> {
    // SAFETY: `attr` is a zero-initialised, 8-byte aligned buffer of the size passed, laid out
    // as the kernel's `union bpf_attr` for `cmd`; every pointer stored in it (by the callers)
    // points to memory that outlives this call and is as large as the kernel will access
    // (key and value sizes are checked against the map's in `Map`).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            std::mem::size_of::<BpfAttr>() as libc::c_uint,
        )
    };
    cvt(r as libc::c_int)
}

/// One BPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    code: u8,
    regs: u8, // dst:4 (low), src:4 (high)
    off: i16,
    imm: i32,
}

/// Registers: `R0` return value, `R1`–`R5` arguments (clobbered by calls), `R6`–`R9`
/// callee-saved, `R10` the read-only frame pointer.
pub type Reg = u8;
pub const R0: Reg = 0;
pub const R1: Reg = 1;
pub const R2: Reg = 2;
pub const R3: Reg = 3;
pub const R4: Reg = 4;
pub const R5: Reg = 5;
pub const R6: Reg = 6;
pub const R7: Reg = 7;
pub const R8: Reg = 8;
pub const R9: Reg = 9;
pub const R10: Reg = 10;

/// Memory access sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    B = 0x10,
    H = 0x08,
    W = 0x00,
    DW = 0x18,
}

/// 64-bit ALU operations (`BPF_ALU64 | op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alu {
    Add = 0x00,
    Sub = 0x10,
    Or = 0x40,
    And = 0x50,
    Lsh = 0x60,
    Rsh = 0x70,
    Xor = 0xa0,
    Mov = 0xb0,
}

/// Conditional jumps (`BPF_JMP | op`), unsigned comparisons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jmp {
    Eq = 0x10,
    Gt = 0x20,
    Ne = 0x50,
}

/// Helper functions (`enum bpf_func_id`).
pub const FUNC_MAP_LOOKUP_ELEM: i32 = 1;
pub const FUNC_SKB_STORE_BYTES: i32 = 9;
pub const FUNC_SKB_LOAD_BYTES: i32 = 26;
pub const FUNC_CSUM_DIFF: i32 = 28;
pub const FUNC_GET_HASH_RECALC: i32 = 34;
pub const FUNC_SKB_ADJUST_ROOM: i32 = 50;
pub const FUNC_REDIRECT_NEIGH: i32 = 152;
pub const FUNC_CHECK_MTU: i32 = 163;
pub const FUNC_SKB_VLAN_PUSH: i32 = 18;
pub const FUNC_REDIRECT: i32 = 23;
pub const FUNC_XDP_ADJUST_HEAD: i32 = 44;
pub const FUNC_REDIRECT_MAP: i32 = 51;
pub const FUNC_REDIRECT_PEER: i32 = 155;

const fn raw(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

impl Insn {
    /// `dst op= imm` (64-bit).
    pub const fn alu_imm(op: Alu, dst: Reg, imm: i32) -> Insn {
        raw(0x07 | op as u8, dst, 0, 0, imm)
    }
    /// `dst op= src` (64-bit).
    pub const fn alu_reg(op: Alu, dst: Reg, src: Reg) -> Insn {
        raw(0x0f | op as u8, dst, src, 0, 0)
    }
    /// `dst = imm` (sign-extended to 64 bits).
    pub const fn mov_imm(dst: Reg, imm: i32) -> Insn {
        Insn::alu_imm(Alu::Mov, dst, imm)
    }
    /// `dst = src`.
    pub const fn mov_reg(dst: Reg, src: Reg) -> Insn {
        Insn::alu_reg(Alu::Mov, dst, src)
    }
    /// `dst = *(size *)(src + off)` (zero-extended).
    pub const fn load(size: Size, dst: Reg, src: Reg, off: i16) -> Insn {
        raw(0x61 | size as u8, dst, src, off, 0)
    }
    /// `*(size *)(dst + off) = src`.
    pub const fn store(size: Size, dst: Reg, off: i16, src: Reg) -> Insn {
        raw(0x63 | size as u8, dst, src, off, 0)
    }
    /// `dst = imm64`: two instruction slots.
    pub const fn load_imm64(dst: Reg, imm: u64) -> [Insn; 2] {
        [
            raw(0x18, dst, 0, 0, imm as u32 as i32),
            raw(0, 0, 0, 0, (imm >> 32) as u32 as i32),
        ]
    }
    /// `dst = map` (the map's fd, resolved by the kernel at load time): two slots.
    pub fn load_map(dst: Reg, map: &Map) -> [Insn; 2] {
        const PSEUDO_MAP_FD: Reg = 1;
        [
            raw(0x18, dst, PSEUDO_MAP_FD, 0, map.fd.as_raw_fd()),
            raw(0, 0, 0, 0, 0),
        ]
    }
    /// `if dst op imm goto +off`.
    pub const fn jump_imm(op: Jmp, dst: Reg, imm: i32, off: i16) -> Insn {
        raw(0x05 | op as u8, dst, 0, off, imm)
    }
    /// `if dst op src goto +off`.
    pub const fn jump_reg(op: Jmp, dst: Reg, src: Reg, off: i16) -> Insn {
        raw(0x0d | op as u8, dst, src, off, 0)
    }
    /// `goto +off`.
    pub const fn jump(off: i16) -> Insn {
        raw(0x05, 0, 0, off, 0)
    }
    /// Calls helper `func` (arguments in `R1`–`R5`, result in `R0`).
    pub const fn call(func: i32) -> Insn {
        raw(0x85, 0, 0, 0, func)
    }
    /// Calls kernel function `btf_id` (a `BTF_KIND_FUNC` of vmlinux's BTF, [`kfunc_id`]).
    pub const fn call_kfunc(btf_id: u32) -> Insn {
        const PSEUDO_KFUNC_CALL: Reg = 2;
        raw(0x85, 0, PSEUDO_KFUNC_CALL, 0, btf_id as i32)
    }
    /// `dst = htobe16(dst)` (`BPF_END | BPF_TO_BE`, 16 bits).
    pub const fn to_be16(dst: Reg) -> Insn {
        raw(0xdc, dst, 0, 0, 16)
    }
    /// `return R0`.
    pub const fn exit() -> Insn {
        raw(0x95, 0, 0, 0, 0)
    }
    /// This instruction with offset `off` (a jump's distance, resolved after the fact).
    pub const fn with_off(self, off: i16) -> Insn {
        Insn { off, ..self }
    }
}

/// Map kinds used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Hash = 1,
    PercpuArray = 6,
    XskMap = 17,
}

/// A BPF map with fixed key and value sizes.
#[derive(Debug)]
pub struct Map {
    fd: OwnedFd,
    kind: MapKind,
    key_size: u32,
    value_size: u32,
    entries: u32,
    /// [`Map::lookup_size`], worked out once (a per-CPU map's depends on `/sys`).
    lookup_size: usize,
}

impl Map {
    /// A new map of `kind` with `entries` entries of `key_size` → `value_size` bytes.
    pub fn new(kind: MapKind, key_size: u32, value_size: u32, entries: u32) -> io::Result<Map> {
        let mut a = BpfAttr::new();
        // map_type, key_size, value_size, max_entries
        a.u32(0, kind as u32)
            .u32(4, key_size)
            .u32(8, value_size)
            .u32(12, entries.max(1));
        let lookup_size = match kind {
            MapKind::PercpuArray => possible_cpus()? * (value_size as usize).next_multiple_of(8),
            _ => value_size as usize,
        };
        let fd = bpf(BPF_MAP_CREATE, &mut a)?;
        Ok(Map {
            fd: owned(fd),
            kind,
            key_size,
            value_size,
            entries: entries.max(1),
            lookup_size,
        })
    }

    /// Entries the map holds at most.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Bytes a lookup fills: the value size, or for a per-CPU map one value (rounded up to
    /// 8 bytes) per possible CPU.
    pub fn lookup_size(&self) -> usize {
        self.lookup_size
    }

    fn check(&self, key: &[u8], value: Option<usize>) -> io::Result<()> {
        let bad = key.len() != self.key_size as usize
            || value.is_some_and(|v| v != self.value_size as usize);
        if bad {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "key or value size does not match the map's",
            ));
        }
        Ok(())
    }

    /// Sets `key` to `value` (creating or replacing it).
    pub fn update(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        self.check(key, Some(value.len()))?;
        let mut a = BpfAttr::new();
        // map_fd, (pad), key ptr, value ptr, flags (BPF_ANY)
        a.u32(0, self.fd.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, value.as_ptr() as u64)
            .u64(24, 0);
        bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
    }

    /// Sets `key` of a per-CPU map to `values`: one value per possible CPU, each rounded up
    /// to 8 bytes ([`Map::lookup_size`] bytes in all).
    pub fn update_percpu(&self, key: &[u8], values: &[u8]) -> io::Result<()> {
        self.check(key, None)?;
        if self.kind != MapKind::PercpuArray || values.len() != self.lookup_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a per-CPU map, or not one value per possible CPU",
            ));
        }
        let mut a = BpfAttr::new();
        a.u32(0, self.fd.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, values.as_ptr() as u64)
            .u64(24, 0);
        bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
    }

    /// Removes `key`; a key that is not there is no error.
    pub fn delete(&self, key: &[u8]) -> io::Result<()> {
        self.check(key, None)?;
        let mut a = BpfAttr::new();
        a.u32(0, self.fd.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64);
        match bpf(BPF_MAP_DELETE_ELEM, &mut a) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.map(drop),
        }
    }

    /// The value of `key` into `out` (of [`Map::lookup_size`] bytes); `false` if absent.
    pub fn lookup(&self, key: &[u8], out: &mut [u8]) -> io::Result<bool> {
        self.check(key, None)?;
        if out.len() != self.lookup_size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "lookup buffer size does not match the map's",
            ));
        }
        let mut a = BpfAttr::new();
        a.u32(0, self.fd.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, out.as_mut_ptr() as u64);
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for Map {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// CPUs the kernel may ever bring up (`/sys/devices/system/cpu/possible`): the number of
/// values a per-CPU map lookup returns.
pub fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut n = 0;
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad CPU list");
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let (a, b): (usize, usize) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        n = n.max(b + 1).max(a + 1);
    }
    Ok(n.max(1))
}

/// Program kinds used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgKind {
    /// tc (`BPF_PROG_TYPE_SCHED_CLS`), attached with [`tcx_attach`].
    SchedCls = 3,
    /// XDP, attached with [`crate::xdp::attach`].
    Xdp = 6,
}

/// `struct __sk_buff` field offsets a tc program reads.
pub mod skb {
    pub const LEN: i16 = 0;
    pub const VLAN_PRESENT: i16 = 20;
    /// The interface the frame was received on (`skb_iif`); 0 for the host's own.
    pub const INGRESS_IFINDEX: i16 = 36;
    pub const DATA: i16 = 76;
    pub const DATA_END: i16 = 80;
}

/// `bpf_skb_adjust_room`'s modes and flags (`include/uapi/linux/bpf.h`).
pub mod adj_room {
    /// Room made or taken right after the MAC header.
    pub const MODE_MAC: i32 = 1;
    /// Keep `gso_size`: the segments the sender chose stay as they are.
    pub const FIXED_GSO: u64 = 1 << 0;
    pub const ENCAP_L3_IPV4: u64 = 1 << 1;
    pub const ENCAP_L4_UDP: u64 = 1 << 4;
    pub const ENCAP_L2_ETH: u64 = 1 << 6;
    pub const DECAP_L3_IPV4: u64 = 1 << 7;
    pub const DECAP_L3_IPV6: u64 = 1 << 8;
    /// The inner L2 header's length, for the segmentation of encapsulated packets.
    pub const fn encap_l2(len: u8) -> u64 {
        (len as u64) << 56
    }
}

/// `bpf_check_mtu`'s flag: check each segment of a GSO packet.
pub const MTU_CHK_SEGS: i32 = 1;

/// tc program return codes.
pub const TC_ACT_OK: i32 = 0;
/// tcx: leave the frame to the next program on the hook (or the stack if none).
pub const TCX_NEXT: i32 = -1;
pub const TC_ACT_SHOT: i32 = 2;

/// The BTF id of kernel function `name` in vmlinux's BTF (`/sys/kernel/btf/vmlinux`), for
/// [`Insn::call_kfunc`]; `None` when this kernel has no such function (or no BTF).
pub fn kfunc_id(name: &str) -> Option<u32> {
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").ok()?;
    btf_func_id(&btf, name)
}

/// The id of the `BTF_KIND_FUNC` named `name` in raw BTF `btf` (native byte order).
fn btf_func_id(btf: &[u8], name: &str) -> Option<u32> {
    const KIND_FUNC: u32 = 12;
    let u32_at = |off: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(btf.get(off..off + 4)?.try_into().ok()?))
    };
    if btf.get(0..2)? != 0xeb9fu16.to_ne_bytes() {
        return None;
    }
    let hdr_len = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
    let types = hdr_len.checked_add(type_off)?;
    let strings = btf.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    let name_of = |off: usize| -> Option<&[u8]> {
        let s = strings.get(off..)?;
        Some(&s[..s.iter().position(|&b| b == 0)?])
    };
    let (mut at, end) = (types, types.checked_add(type_len)?);
    let mut id = 1u32;
    while at + 12 <= end {
        let (name_off, info) = (u32_at(at)? as usize, u32_at(at + 4)?);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        if kind == KIND_FUNC && name_of(name_off)? == name.as_bytes() {
            return Some(id);
        }
        // struct btf_type is 12 bytes; what follows it depends on the kind.
        at += 12
            + match kind {
                1 | 14 | 17 => 4,          // int, var, decl_tag
                3 => 12,                   // array
                4 | 5 => 12 * vlen,        // struct, union
                6 => 8 * vlen,             // enum
                13 => 8 * vlen,            // func_proto
                15 => 12 * vlen,           // datasec
                19 => 12 * vlen,           // enum64
                2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, volatile, const, restrict, func, float, type_tag
                _ => return None,
            };
        id += 1;
    }
    None
}

/// A loaded program.
#[derive(Debug)]
pub struct Program {
    fd: OwnedFd,
}

impl Program {
    /// Loads `insns` as a `kind` program named `name` (at most 15 bytes shown). A verifier
    /// refusal comes back with the verifier's log in the error.
    pub fn load(kind: ProgKind, insns: &[Insn], name: &str) -> io::Result<Program> {
        Program::load_for(kind, insns, name, None)
    }

    /// [`Program::load`], bound to interface `dev` when given (`prog_ifindex` with
    /// `BPF_F_XDP_DEV_BOUND_ONLY`): such an XDP program may call the driver's
    /// receive-metadata kfuncs, and attaches to that interface only, in native mode only.
    pub fn load_for(
        kind: ProgKind,
        insns: &[Insn],
        name: &str,
        dev: Option<u32>,
    ) -> io::Result<Program> {
        const BPF_F_XDP_DEV_BOUND_ONLY: u32 = 1 << 6;
        let license = CString::new("GPL").expect("no NUL");
        let mut log = vec![0u8; 64 * 1024];
        let mut a = BpfAttr::new();
        // prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version,
        // prog_flags, prog_name[16] (at 48), prog_ifindex (64), expected_attach_type (68)
        a.u32(0, kind as u32)
            .u32(4, insns.len() as u32)
            .u64(8, insns.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .u32(24, 1)
            .u32(28, log.len() as u32)
            .u64(32, log.as_mut_ptr() as u64);
        if kind == ProgKind::Xdp {
            a.u32(68, crate::xdp::BPF_XDP);
        }
        if let Some(ifindex) = dev {
            a.u32(44, BPF_F_XDP_DEV_BOUND_ONLY).u32(64, ifindex);
        }
        let n = name.len().min(15);
        a.0[48..48 + n].copy_from_slice(&name.as_bytes()[..n]);
        match bpf(BPF_PROG_LOAD, &mut a) {
            Ok(fd) => Ok(Program { fd: owned(fd) }),
            Err(e) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                Err(io::Error::new(
                    e.kind(),
                    format!("loading BPF program {name}: {e}; verifier: {}", text.trim()),
                ))
            }
        }
    }
}

impl AsRawFd for Program {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Which tc hook of an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcHook {
    Ingress,
    Egress,
}

/// An attached program; dropping it (or the process ending) detaches it.
#[derive(Debug)]
pub struct Link {
    _fd: OwnedFd,
}

impl Link {
    pub(crate) fn from_fd(fd: libc::c_int) -> Link {
        Link { _fd: owned(fd) }
    }
}

/// Attaches tc program `prog` to `hook` of interface `ifindex` through tcx (Linux 6.6), after
/// whatever tcx programs are there already. Needs `CAP_NET_ADMIN` and `CAP_BPF`.
pub fn tcx_attach(prog: &Program, ifindex: u32, hook: TcHook) -> io::Result<Link> {
    let attach_type = match hook {
        TcHook::Ingress => BPF_TCX_INGRESS,
        TcHook::Egress => BPF_TCX_EGRESS,
    };
    let mut a = BpfAttr::new();
    // prog_fd, target_ifindex, attach_type, flags; tcx: relative_fd/id, expected_revision
    a.u32(0, prog.as_raw_fd() as u32)
        .u32(4, ifindex)
        .u32(8, attach_type)
        .u32(12, 0);
    bpf(BPF_LINK_CREATE, &mut a).map(Link::from_fd)
}

/// Adds a `clsact` qdisc to interface `ifindex`, for [`tc_attach_classic`]; `EEXIST` if it
/// has one. Best done while the interface is down (adding it to a running one stops its
/// queues for a moment).
pub fn tc_clsact(ifindex: u32) -> io::Result<()> {
    crate::rtnl::Rtnl::open()?.add_clsact(ifindex)
}

/// Attaches each `(program, hook, name)` to interface `ifindex` the classic way: a
/// direct-action `bpf` filter on its `clsact` qdisc ([`tc_clsact`]). Unlike [`tcx_attach`],
/// which waits for an RCU grace period under the RTNL lock (5 to 20 ms), this costs
/// microseconds, provided one grace period has passed since the qdisc was added (else the
/// first filter waits for an expedited one; docs/veth.md). But nothing of it belongs to the
/// process: the filters stay until the interface goes. So only for an interface that goes
/// with the process (a TAP it created and holds the only fds of).
pub fn tc_attach_classic(ifindex: u32, progs: &[(&Program, TcHook, &str)]) -> io::Result<()> {
    let mut rtnl = crate::rtnl::Rtnl::open()?;
    for &(prog, hook, name) in progs {
        rtnl.add_bpf_filter(
            ifindex,
            hook == TcHook::Ingress,
            prog.as_raw_fd() as u32,
            name,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_kernel_functions_in_btf() {
        assert_eq!(kfunc_id("qswitch_no_such_function"), None);
        if std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
            // A function every kernel has.
            assert!(kfunc_id("tcp_sendmsg").is_some());
        }
        assert_eq!(btf_func_id(b"garbage", "x"), None);
    }

    use qswitch_test_support::root_or_skip;

    #[test]
    fn encodings_match_the_kernel_headers() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        assert_eq!(Insn::mov_imm(R3, 2), raw(0xb7, 3, 0, 0, 2));
        assert_eq!(Insn::call(FUNC_REDIRECT_MAP), raw(0x85, 0, 0, 0, 51));
        assert_eq!(Insn::exit(), raw(0x95, 0, 0, 0, 0));
        // r1 = *(u32 *)(r6 + 76)
        assert_eq!(Insn::load(Size::W, R1, R6, 76), raw(0x61, 1, 6, 76, 0));
        // *(u64 *)(r10 - 8) = r4
        assert_eq!(Insn::store(Size::DW, R10, -8, R4), raw(0x7b, 10, 4, -8, 0));
        assert_eq!(Insn::alu_imm(Alu::Lsh, R5, 32), raw(0x67, 5, 0, 0, 32));
        assert_eq!(Insn::alu_reg(Alu::Or, R4, R5), raw(0x4f, 4, 5, 0, 0));
        assert_eq!(Insn::jump_reg(Jmp::Gt, R4, R3, 7), raw(0x2d, 4, 3, 7, 0));
        assert_eq!(Insn::jump_imm(Jmp::Eq, R0, 0, 3), raw(0x15, 0, 0, 3, 0));
        assert_eq!(Insn::load(Size::H, R5, R2, 4), raw(0x69, 5, 2, 4, 0));
        assert_eq!(Insn::load(Size::B, R5, R2, 4), raw(0x71, 5, 2, 4, 0));
        let [lo, hi] = Insn::load_imm64(R5, 0x0123_4567_89ab_cdef);
        assert_eq!(
            (lo.code, lo.imm as u32, hi.imm as u32),
            (0x18, 0x89ab_cdef, 0x0123_4567)
        );
    }

    #[test]
    fn possible_cpus_counts_at_least_the_online_ones() {
        let n = possible_cpus().unwrap();
        assert!(n >= crate::thread::online_cpus().unwrap().len(), "{n}");
    }

    #[test]
    fn maps_hold_what_is_put_in_and_refuse_wrong_sizes() {
        if !root_or_skip() {
            return;
        }
        let m = Map::new(MapKind::Hash, 8, 16, 4).unwrap();
        let key = 7u64.to_ne_bytes();
        let mut out = [0u8; 16];
        assert!(!m.lookup(&key, &mut out).unwrap());
        m.update(&key, &[1; 16]).unwrap();
        assert!(m.lookup(&key, &mut out).unwrap());
        assert_eq!(out, [1; 16]);
        m.delete(&key).unwrap();
        m.delete(&key).unwrap();
        assert!(!m.lookup(&key, &mut out).unwrap());
        assert!(m.update(&key, &[0; 8]).is_err());
        assert!(m.update(&[0; 4], &[0; 16]).is_err());
        let a = Map::new(MapKind::PercpuArray, 4, 12, 2).unwrap();
        let mut per_cpu = vec![0u8; a.lookup_size()];
        assert_eq!(per_cpu.len(), possible_cpus().unwrap() * 16);
        assert!(a.lookup(&1u32.to_ne_bytes(), &mut per_cpu).unwrap());
        assert!(a.lookup(&1u32.to_ne_bytes(), &mut [0u8; 3]).is_err());
    }

    #[test]
    fn a_refused_program_says_why() {
        if !root_or_skip() {
            return;
        }
        // Reads an uninitialised register.
        let e = Program::load(
            ProgKind::SchedCls,
            &[Insn::mov_reg(R0, R2), Insn::exit()],
            "bad",
        )
        .unwrap_err();
        assert!(e.to_string().contains("verifier"), "{e}");
        let ok = Program::load(
            ProgKind::SchedCls,
            &[Insn::mov_imm(R0, TC_ACT_OK), Insn::exit()],
            "ok",
        );
        assert!(ok.is_ok(), "{ok:?}");
    }
}
