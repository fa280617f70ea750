//! EVPN through FRR: a kernel "shadow" per VXLAN port that zebra watches and programs.
//!
//! ```text
//!   qswitch (this module, one control-plane thread, 1 s tick)          FRR (same netns)
//!   ───────────────────────────────────────────────────────           ─────────────────
//!   switch fdb: local MACs of the port's VLAN ──▶ RTM_NEWNEIGH MAC dev qsdumVNI
//!   (learned on non-VXLAN ports)                    master static     ──▶ zebra ──▶ bgpd:
//!                                                                          type-2 (MAC), type-3 (VNI)
//!   VxlanPort remote table (origin evpn) ◀── RTM_GETNEIGH dump of qsvxVNI ◀── zebra installs
//!   VxlanPort flood list   (origin evpn) ◀──   MAC dst VTEP (extern_learn), 00:00:.. dst VTEP
//!
//!   shadow: bridge qsbrVNI ─┬─ vxlan qsvxVNI (id VNI, local LOCAL, dstport ≠ qswitch's, nolearning)
//!                           └─ veth qsdumVNI (peer qsdpVNI; carries qswitch's local MACs as static entries)
//! ```
//!
//! The shadow's devices are made once with iproute2 (`ip link`, `bridge link`); the MACs
//! go over rtnetlink ([`Rtnl`], with the `netlink-packet-route` crate): one
//! `RTM_NEWNEIGH`/`RTM_DELNEIGH` per MAC on one socket, as `bridge fdb replace|del MAC dev
//! qsdumVNI master static` would send (`NDA_LLADDR`, `NTF_MASTER`, `NUD_NOARP`), and one
//! `RTM_GETNEIGH` dump for what zebra installed, instead of a `bridge` process per MAC (4 000
//! MACs cost 4 000 processes and 3.5 CPU-seconds before). Each MAC is validated (never the
//! zero MAC, never a group address) and applied on its own: one that fails is reported and
//! retried next round, and never keeps the others from being advertised or withdrawn
//! (issue 27, F5: one frame from 00:00:00:00:00:00 used to abort every round).
//!
//! zebra discovers VNIs from vxlan devices enslaved to a bridge, advertises the MACs the
//! bridge has on its non-VXLAN ports and installs remote MACs and flood VTEPs on the vxlan
//! device: exactly the kernel state the shadow offers, so FRR runs unmodified (as for OVN's
//! EVPN support). The shadow's vxlan device never carries traffic: it listens on another UDP
//! port ([`shadow_dstport`]) so qswitch's own socket keeps the VXLAN port. The [`Shadow`] trait
//! is the whole interface between the mirroring logic ([`Evpn::tick`]) and the kernel, so
//! another transport (rtnetlink, FRR's dataplane API) can replace [`KernelShadow`].

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::IpAddr;
use std::process::Command;
use std::sync::Arc;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use qswitch_dp::port::vxlan::{Origin, VxlanPort};
use qswitch_dp::Switch;
use qswitch_wire::MacAddr;

/// What zebra installed for one VNI: remote MAC → VTEP, and the flood list.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Remote {
    pub macs: BTreeMap<MacAddr, IpAddr>,
    pub flood: BTreeSet<IpAddr>,
}

/// The kernel side of one VXLAN port's EVPN mirror.
pub trait Shadow: Send {
    /// Makes the local MACs advertised `macs`, as far as it can: each MAC is applied on its
    /// own, and those that could not be (added or withdrawn) are returned with the reason;
    /// the rest is done. MACs that are not unicast or are zero are refused.
    fn set_local_macs(&mut self, macs: &BTreeSet<MacAddr>) -> Vec<(MacAddr, io::Error)>;
    /// What FRR installed (remote MACs and flood VTEPs).
    fn remote(&mut self) -> io::Result<Remote>;
    /// Removes the shadow (FRR withdraws its routes).
    fn remove(&mut self);
}

/// The UDP port of the shadow vxlan device: any port but qswitch's own.
pub fn shadow_dstport(dstport: u16) -> u16 {
    if dstport == 4790 {
        4791
    } else {
        4790
    }
}

/// Whether `mac` may be advertised as a local MAC: a unicast address that is not zero.
pub fn advertisable(mac: MacAddr) -> bool {
    mac.is_unicast() && mac != MacAddr::ZERO
}

/// A bridge + vxlan + veth device set in the current network namespace: created with
/// iproute2, its MACs kept over rtnetlink.
pub struct KernelShadow {
    vni: u32,
    rtnl: Rtnl,
    /// Interface indexes of the dummy (local MACs) and the vxlan device (remote MACs).
    dum: u32,
    vx: u32,
    installed: BTreeSet<MacAddr>,
}

fn run(args: &[&str]) -> io::Result<String> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl KernelShadow {
    fn names(vni: u32) -> [String; 3] {
        [
            format!("qsbr{vni}"),
            format!("qsvx{vni}"),
            format!("qsdum{vni}"),
        ]
    }

    /// Creates (or recreates) the shadow of VNI `vni` whose VTEP address is `local`.
    pub fn create(vni: u32, local: IpAddr, dstport: u16) -> io::Result<KernelShadow> {
        let [br, vx, dum] = Self::names(vni);
        for d in [&br, &vx, &dum] {
            let _ = run(&["ip", "link", "del", d]);
        }
        let (id, local, port) = (
            vni.to_string(),
            local.to_string(),
            shadow_dstport(dstport).to_string(),
        );
        run(&["ip", "link", "add", &br, "type", "bridge"])?;
        run(&[
            "ip",
            "link",
            "add",
            &vx,
            "type",
            "vxlan",
            "id",
            &id,
            "local",
            &local,
            "dstport",
            &port,
            "nolearning",
        ])?;
        // A veth pair rather than a dummy: it needs no module beyond what containers have.
        let peer = format!("qsdp{vni}");
        run(&[
            "ip", "link", "add", &dum, "type", "veth", "peer", "name", &peer,
        ])?;
        // Nothing but qswitch's static entries may appear on the shadow: no IPv6 chatter
        // (router solicitations would be learned and advertised), no learning.
        for d in [&br, &dum, &peer, &vx] {
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{d}/disable_ipv6"), "1");
        }
        run(&["ip", "link", "set", &peer, "up"])?;
        run(&["ip", "link", "set", &vx, "master", &br])?;
        run(&["ip", "link", "set", &dum, "master", &br])?;
        run(&["bridge", "link", "set", "dev", &vx, "learning", "off"])?;
        run(&["bridge", "link", "set", "dev", &dum, "learning", "off"])?;
        for d in [&dum, &vx, &br] {
            run(&["ip", "link", "set", d, "up"])?;
        }
        Ok(KernelShadow {
            vni,
            rtnl: Rtnl::open()?,
            dum: qswitch_sys::xdp::ifindex(&dum)?,
            vx: qswitch_sys::xdp::ifindex(&vx)?,
            installed: BTreeSet::new(),
        })
    }
}

impl Shadow for KernelShadow {
    fn set_local_macs(&mut self, macs: &BTreeSet<MacAddr>) -> Vec<(MacAddr, io::Error)> {
        let mut failed = Vec::new();
        let want: Vec<MacAddr> = macs.difference(&self.installed).copied().collect();
        for m in want {
            if !advertisable(m) {
                failed.push((m, io::Error::other("not a unicast address")));
                continue;
            }
            match self.rtnl.fdb_replace(self.dum, m) {
                Ok(()) => {
                    self.installed.insert(m);
                }
                Err(e) => failed.push((m, e)),
            }
        }
        let gone: Vec<MacAddr> = self.installed.difference(macs).copied().collect();
        for m in gone {
            match self.rtnl.fdb_del(self.dum, m) {
                // Already gone (someone removed it by hand): withdrawn all the same.
                Ok(()) => {
                    self.installed.remove(&m);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.installed.remove(&m);
                }
                Err(e) => failed.push((m, e)),
            }
        }
        failed
    }

    fn remote(&mut self) -> io::Result<Remote> {
        self.rtnl.fdb_dump(self.vx)
    }

    fn remove(&mut self) {
        for d in Self::names(self.vni) {
            let _ = run(&["ip", "link", "del", &d]);
        }
    }
}

/// An rtnetlink socket for bridge fdb entries (`AF_BRIDGE` neighbours).
pub struct Rtnl {
    sock: netlink_sys::Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    /// A `NETLINK_ROUTE` socket in the current network namespace.
    pub fn open() -> io::Result<Rtnl> {
        let mut sock = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        Ok(Rtnl {
            sock,
            seq: 0,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    fn fdb_message(ifindex: u32, mac: MacAddr) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Bridge;
        m.header.ifindex = ifindex;
        // `static`: NUD_NOARP; `master`: the entry belongs to the bridge the port is in.
        m.header.state = NeighbourState::Noarp;
        m.header.flags = NeighbourFlags::Controller;
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
        m
    }

    /// `bridge fdb replace MAC dev IFINDEX master static`.
    pub fn fdb_replace(&mut self, ifindex: u32, mac: MacAddr) -> io::Result<()> {
        let msg = RouteNetlinkMessage::NewNeighbour(Self::fdb_message(ifindex, mac));
        self.request(msg, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, |_| {})
    }

    /// `bridge fdb del MAC dev IFINDEX master static`.
    pub fn fdb_del(&mut self, ifindex: u32, mac: MacAddr) -> io::Result<()> {
        let msg = RouteNetlinkMessage::DelNeighbour(Self::fdb_message(ifindex, mac));
        self.request(msg, NLM_F_ACK, |_| {})
    }

    /// `bridge fdb show dev IFINDEX`: entries with a remote (`NDA_DST`) are remote MACs, the
    /// all-zero MAC's are the flood list.
    pub fn fdb_dump(&mut self, ifindex: u32) -> io::Result<Remote> {
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Bridge;
        let mut r = Remote::default();
        self.request(RouteNetlinkMessage::GetNeighbour(m), NLM_F_DUMP, |msg| {
            let RouteNetlinkMessage::NewNeighbour(n) = msg else {
                return;
            };
            if n.header.ifindex != ifindex {
                return;
            }
            let (mut mac, mut dst) = (None, None);
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::LinkLayerAddress(b) => {
                        mac = <[u8; 6]>::try_from(b.as_slice()).ok().map(MacAddr);
                    }
                    NeighbourAttribute::Destination(d) => dst = neighbour_ip(d),
                    _ => {}
                }
            }
            if let (Some(mac), Some(dst)) = (mac, dst) {
                if mac == MacAddr::ZERO {
                    r.flood.insert(dst);
                } else if mac.is_unicast() {
                    r.macs.insert(mac, dst);
                }
            }
        })?;
        Ok(r)
    }

    /// Sends `msg` with `flags` and reads the answer: each message of a dump goes to `each`;
    /// an error answer is the error.
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        mut each: impl FnMut(RouteNetlinkMessage),
    ) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        nl.finalize();
        let mut out = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut out);
        self.sock.send(&out, 0)?;
        loop {
            self.buf.clear();
            let n = self.sock.recv(&mut self.buf, 0)?;
            let mut at = 0;
            while at < n {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[at..n])
                    .map_err(io::Error::other)?;
                let len = m.header.length as usize;
                if len == 0 {
                    return Err(io::Error::other("netlink: empty message"));
                }
                at += len.next_multiple_of(4);
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(()),
                            Some(_) => Err(e.to_io()),
                        }
                    }
                    NetlinkPayload::InnerMessage(inner) => each(inner),
                    _ => {}
                }
            }
        }
    }
}

/// The IP address of a bridge fdb entry's `NDA_DST` (the kernel sends it as 4 or 16 bytes in
/// an `AF_BRIDGE` message, which the crate leaves as `Other`).
fn neighbour_ip(d: &NeighbourAddress) -> Option<IpAddr> {
    match d {
        NeighbourAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        NeighbourAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        NeighbourAddress::Other(b) => match b.len() {
            4 => <[u8; 4]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            16 => <[u8; 16]>::try_from(b.as_slice()).ok().map(IpAddr::from),
            _ => None,
        },
        _ => None,
    }
}

/// Parses `bridge -j fdb show dev VXLAN`: entries with a `dst` are remote MACs, the all-zero
/// MAC's are the flood list.
pub fn parse_fdb(json: &str) -> io::Result<Remote> {
    let v: serde_json::Value =
        serde_json::from_str(if json.trim().is_empty() { "[]" } else { json })
            .map_err(io::Error::other)?;
    let mut r = Remote::default();
    for e in v.as_array().into_iter().flatten() {
        let (Some(mac), Some(dst)) = (
            e.get("mac").and_then(|m| m.as_str()),
            e.get("dst").and_then(|d| d.as_str()),
        ) else {
            continue;
        };
        let (Ok(mac), Ok(dst)) = (mac.parse::<MacAddr>(), dst.parse::<IpAddr>()) else {
            continue;
        };
        if mac == MacAddr::ZERO {
            r.flood.insert(dst);
        } else if mac.is_unicast() {
            r.macs.insert(mac, dst);
        }
    }
    Ok(r)
}

struct Mirror {
    shadow: Box<dyn Shadow>,
    port: Arc<VxlanPort>,
    vlan: u16,
    /// What this module put into the port (origin evpn).
    remote: Remote,
    /// Local MACs the shadow could not take last round.
    failed: BTreeSet<MacAddr>,
}

/// Creates the shadow of a VXLAN port.
pub type ShadowFactory = Box<dyn FnMut(&VxlanPort) -> io::Result<Box<dyn Shadow>> + Send>;

/// The EVPN mirror of every VXLAN port of a switch.
pub struct Evpn {
    factory: ShadowFactory,
    mirrors: BTreeMap<String, Mirror>,
}

impl Default for Evpn {
    fn default() -> Self {
        Evpn::new(Box::new(|p: &VxlanPort| {
            KernelShadow::create(p.vni(), p.local(), p.dstport())
                .map(|s| Box::new(s) as Box<dyn Shadow>)
        }))
    }
}

impl Evpn {
    pub fn new(factory: ShadowFactory) -> Evpn {
        Evpn {
            factory,
            mirrors: BTreeMap::new(),
        }
    }

    /// One round: shadows for new VXLAN ports (and removed for gone ones), local MACs out,
    /// remote MACs and flood VTEPs in.
    pub fn tick(&mut self, sw: &Switch) {
        let ports = sw.vxlan_ports();
        let names: BTreeSet<&String> = ports.iter().map(|(n, _, _)| n).collect();
        let gone: Vec<String> = self
            .mirrors
            .keys()
            .filter(|n| !names.contains(n))
            .cloned()
            .collect();
        for n in gone {
            if let Some(mut m) = self.mirrors.remove(&n) {
                m.shadow.remove();
            }
        }
        for (name, vlan, port) in &ports {
            let stale = self
                .mirrors
                .get(name)
                .is_some_and(|m| !Arc::ptr_eq(&m.port, port));
            if stale {
                if let Some(mut m) = self.mirrors.remove(name) {
                    m.shadow.remove();
                }
            }
            if !self.mirrors.contains_key(name) {
                match (self.factory)(port) {
                    Ok(shadow) => {
                        tracing::info!(port = %name, vni = port.vni(), "evpn: shadow created");
                        self.mirrors.insert(
                            name.clone(),
                            Mirror {
                                shadow,
                                port: port.clone(),
                                vlan: *vlan,
                                remote: Remote::default(),
                                failed: BTreeSet::new(),
                            },
                        );
                    }
                    Err(e) => {
                        tracing::warn!(port = %name, error = %e, "evpn: cannot create the shadow");
                        continue;
                    }
                }
            }
        }
        let fdb = sw.fdb();
        for (name, m) in &mut self.mirrors {
            let local: BTreeSet<MacAddr> = fdb
                .iter()
                .filter(|e| e.vlan == m.vlan && e.vtep.is_none() && !names_has(&ports, &e.port))
                .filter_map(|e| e.mac.parse().ok())
                .filter(|&mac| advertisable(mac))
                .collect();
            let failed = m.shadow.set_local_macs(&local);
            // Each failure once (while it lasts), not every round.
            let now: BTreeSet<MacAddr> = failed.iter().map(|(mac, _)| *mac).collect();
            for (mac, e) in &failed {
                if !m.failed.contains(mac) {
                    tracing::warn!(port = %name, mac = %mac, error = %e,
                        "evpn: cannot mirror a local MAC (retried every round)");
                }
            }
            m.failed = now;
            match m.shadow.remote() {
                Ok(r) => apply(m, r),
                Err(e) => tracing::warn!(port = %name, error = %e, "evpn: cannot read remote MACs"),
            }
        }
    }

    /// Removes every shadow and every EVPN entry.
    pub fn shutdown(&mut self) {
        for (_, mut m) in std::mem::take(&mut self.mirrors) {
            m.shadow.remove();
            m.port.remove_macs_by_origin(Origin::Evpn);
            m.port.remove_flood_by_origin(Origin::Evpn);
        }
    }
}

fn names_has(ports: &[(String, u16, Arc<VxlanPort>)], name: &str) -> bool {
    ports.iter().any(|(n, _, _)| n == name)
}

/// Brings the port's EVPN entries to `r`.
fn apply(m: &mut Mirror, mut r: Remote) {
    let local = m.port.local();
    r.flood.remove(&local);
    r.macs.retain(|_, v| *v != local);
    for (mac, vtep) in &m.remote.macs {
        if r.macs.get(mac) != Some(vtep) {
            m.port.remove_mac(*mac, Origin::Evpn);
        }
    }
    for (mac, vtep) in &r.macs {
        if m.remote.macs.get(mac) != Some(vtep) {
            m.port.add_mac(*mac, *vtep, Origin::Evpn);
        }
    }
    for v in m.remote.flood.difference(&r.flood) {
        m.port.remove_flood(*v, Origin::Evpn);
    }
    for v in r.flood.difference(&m.remote.flood) {
        m.port.add_flood(*v, Origin::Evpn);
    }
    m.remote = r;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_zebra_installs() {
        let j = r#"[{"mac":"00:00:00:00:00:00","ifname":"qsvx100","dst":"10.0.0.2","flags":["self"],"state":"permanent"},
                   {"mac":"52:54:00:00:00:0b","ifname":"qsvx100","dst":"10.0.0.2","flags":["self","extern_learn"],"state":""},
                   {"mac":"52:54:00:00:00:0c","ifname":"qsvx100","master":"qsbr100","flags":["extern_learn"],"state":""},
                   {"mac":"9a:00:00:00:00:01","ifname":"qsvx100","vlan":1,"state":"permanent"}]"#;
        let r = parse_fdb(j).unwrap();
        assert_eq!(r.flood.len(), 1);
        assert_eq!(r.macs.len(), 1);
        assert_eq!(
            r.macs[&"52:54:00:00:00:0b".parse().unwrap()],
            "10.0.0.2".parse::<IpAddr>().unwrap()
        );
        assert_eq!(parse_fdb("").unwrap(), Remote::default());
    }
}
