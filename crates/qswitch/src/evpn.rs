//! EVPN through FRR: a kernel "shadow" per VXLAN port that zebra watches and programs.
//!
//! ```text
//!   qswitch (this module, one control-plane thread, 1 s tick)          FRR (same netns)
//!   ───────────────────────────────────────────────────────           ─────────────────
//!   switch fdb: local MACs of the port's VLAN ──▶ bridge fdb replace MAC dev qsdumVNI
//!   (learned on non-VXLAN ports)                    master static     ──▶ zebra ──▶ bgpd:
//!                                                                          type-2 (MAC), type-3 (VNI)
//!   VxlanPort remote table (origin evpn) ◀── bridge -j fdb show dev qsvxVNI ◀── zebra installs
//!   VxlanPort flood list   (origin evpn) ◀──   MAC dst VTEP (extern_learn), 00:00:.. dst VTEP
//!
//!   shadow: bridge qsbrVNI ─┬─ vxlan qsvxVNI (id VNI, local LOCAL, dstport ≠ qswitch's, nolearning)
//!                           └─ veth qsdumVNI (peer qsdpVNI; carries qswitch's local MACs as static entries)
//! ```
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
    /// Makes the local MACs advertised exactly `macs`.
    fn set_local_macs(&mut self, macs: &BTreeSet<MacAddr>) -> io::Result<()>;
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

/// A bridge + vxlan + dummy device set in the current network namespace, driven with
/// iproute2 (`ip`, `bridge`).
pub struct KernelShadow {
    vni: u32,
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
            installed: BTreeSet::new(),
        })
    }
}

impl Shadow for KernelShadow {
    fn set_local_macs(&mut self, macs: &BTreeSet<MacAddr>) -> io::Result<()> {
        let [_, _, dum] = Self::names(self.vni);
        for m in macs.difference(&self.installed.clone()) {
            let m = m.to_string();
            run(&[
                "bridge", "fdb", "replace", &m, "dev", &dum, "master", "static",
            ])?;
        }
        for m in self.installed.difference(macs) {
            let m = m.to_string();
            let _ = run(&["bridge", "fdb", "del", &m, "dev", &dum, "master", "static"]);
        }
        self.installed = macs.clone();
        Ok(())
    }

    fn remote(&mut self) -> io::Result<Remote> {
        let [_, vx, _] = Self::names(self.vni);
        parse_fdb(&run(&["bridge", "-j", "fdb", "show", "dev", &vx])?)
    }

    fn remove(&mut self) {
        for d in Self::names(self.vni) {
            let _ = run(&["ip", "link", "del", &d]);
        }
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
                .collect();
            if let Err(e) = m.shadow.set_local_macs(&local) {
                tracing::warn!(port = %name, error = %e, "evpn: cannot mirror local MACs");
            }
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
