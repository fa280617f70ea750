//! ADD, DEL, CHECK, STATUS and GC.
//!
//! A port belongs to one attachment `(network, CNI_CONTAINERID, CNI_IFNAME)`: its name, its
//! host-side veth and its default MAC are derived from that triple ([`Names`]), and it
//! carries the triple as its `owner`, which the daemon persists with the port. So a
//! repeated ADD finds the port it made before, DEL needs nothing but the attachment, and GC
//! finds a network's ports in `port list`.

use std::path::{Path, PathBuf};

use qswitch_api::client::{call, CallError};
use qswitch_api::config::{PortConfig, PortOwner};
use qswitch_api::request::PortInfo;
use qswitch_api::{Request, Response};
use serde_json::{json, Value};

use crate::conf::{Attachment, Input, Mode, Version};
use crate::error::{failed, invalid_config, CniError, Code, Result};
use crate::ipam::{self, Call};
use crate::link;

/// Where vhost-user sockets go unless the config says otherwise.
pub const DEFAULT_SOCKET_DIR: &str = "/run/qswitch/vhost-user";

/// The names derived from an attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The qswitch port: `cni-` and 12 hex digits.
    pub port: String,
    /// The root-namespace veth end: `qsc` and the same 12 digits (15 bytes, IFNAMSIZ).
    pub host: String,
    /// The container interface's MAC when nothing sets one: locally administered, unicast.
    pub mac: String,
}

impl Names {
    pub fn of(network: &str, container: &str, ifname: &str) -> Names {
        // FNV-1a, 64 bits, over the three strings NUL-separated: 48 bits of it name the port
        // (a collision between two attachments is refused, not merged: see `add`).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in [network, container, ifname].join("\0").bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let id = h >> 16;
        let m = h.to_be_bytes();
        Names {
            port: format!("cni-{id:012x}"),
            host: format!("qsc{id:012x}"),
            mac: format!(
                "0a:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[7], m[6], m[5], m[4], m[3]
            ),
        }
    }

    fn for_attachment(input: &Input, att: &Attachment) -> Names {
        Names::of(&input.conf.name, &att.container, att.ifname.as_str())
    }
}

/// One control request; an unreachable daemon is "try again later" (code 11).
fn daemon(control: &Path, req: &Request) -> Result<Response> {
    call(control, req).map_err(|e| match e {
        CallError::NotListening(_) | CallError::Closed | CallError::Receive(_) => CniError::new(
            Code::TryAgainLater,
            "qswitch is not reachable, try again later",
            e.to_string(),
        ),
        CallError::Daemon(m) => failed("qswitch refused the request", m),
        e => failed("cannot talk to qswitch", e.to_string()),
    })
}

fn ports(control: &Path) -> Result<Vec<PortInfo>> {
    match daemon(control, &Request::PortList)? {
        Response::Ports { ports } => Ok(ports),
        r => Err(failed("unexpected reply from qswitch", format!("{r:?}"))),
    }
}

fn owner_of(input: &Input, att: &Attachment) -> PortOwner {
    PortOwner {
        cni: input.conf.name.clone(),
        container: att.container.clone(),
        ifname: att.ifname.to_string(),
    }
}

/// The vhost-user socket of an attachment.
fn socket_path(input: &Input, names: &Names) -> PathBuf {
    input
        .conf
        .socket_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET_DIR))
        .join(format!("{}.sock", names.port))
}

/// The port as qswitch should have it: its keys as in qswitch.toml, checked by the same
/// parser the daemon uses.
fn port_config(
    input: &Input,
    att: &Attachment,
    names: &Names,
    mac: &str,
    ips: &[String],
) -> Result<PortConfig> {
    let c = &input.conf;
    let mut keys = json!({ "name": names.port, "owner": owner_of(input, att) });
    match c.mode {
        Mode::Veth => {
            keys["type"] = json!("veth");
            keys["ifname"] = json!(names.host);
            if let Some(f) = c.fastpath {
                keys["fastpath"] = json!(f);
            }
        }
        Mode::VhostUser => {
            keys["type"] = json!("vhost-user");
            keys["socket"] = json!(socket_path(input, names));
            keys["mode"] = json!(c.vhost_mode.as_deref().unwrap_or("server"));
            keys["queues"] = json!(c.queues.unwrap_or(1));
        }
    }
    if let Some(v) = c.vlan {
        keys["vlan"] = json!(v);
    }
    if let Some(q) = &c.qos {
        keys["qos"] = q.clone();
    }
    if c.port_security {
        keys["security"] = json!({ "macs": [mac], "ips": security_ips(ips) });
    }
    serde_json::from_value(keys).map_err(|e| invalid_config(e.to_string()))
}

/// The sources port security allows for IPAM's addresses: the addresses themselves, not
/// their subnets (a pod may send from its own only), and with IPv6 the link-local prefix
/// neighbour discovery needs.
fn security_ips(ips: &[String]) -> Vec<&str> {
    ips.iter()
        .map(|a| a.split_once('/').map_or(a.as_str(), |(h, _)| h))
        .chain(ips.iter().any(|a| a.contains(':')).then_some("fe80::/64"))
        .collect()
}

/// Whether the IPAM plugin needs the interface up and switched before it can answer: DHCP
/// asks a server on the network the port joins.
fn ipam_needs_link(input: &Input) -> bool {
    input.conf.ipam.as_ref().is_some_and(|i| i.kind == "dhcp")
}

/// The IPAM result's addresses (`a.b.c.d/len`).
fn ipam_addrs(ipam: &Value) -> Vec<String> {
    ipam["ips"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["address"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The `ip -batch` lines that bring `ifname` up with the IPAM result's addresses and routes
/// (a route without `gw` goes via the gateway of its family, as the reference plugins do).
fn netns_script(ifname: &str, ipam: &Value) -> Result<String> {
    let mut s = format!("link set dev {ifname} up\n");
    let empty = Vec::new();
    let ips = ipam["ips"].as_array().unwrap_or(&empty);
    let mut gw4 = None;
    let mut gw6 = None;
    for ip in ips {
        let a = ip["address"]
            .as_str()
            .ok_or_else(|| failed("IPAM result without address", ip.to_string()))?;
        check_token(a)?;
        if a.contains(':') {
            s += &format!("addr add {a} dev {ifname} nodad\n");
        } else {
            s += &format!("addr add {a} dev {ifname}\n");
        }
        if let Some(g) = ip["gateway"].as_str() {
            check_token(g)?;
            if g.contains(':') {
                gw6.get_or_insert(g);
            } else {
                gw4.get_or_insert(g);
            }
        }
    }
    for r in ipam["routes"].as_array().unwrap_or(&empty) {
        let dst = r["dst"]
            .as_str()
            .ok_or_else(|| failed("IPAM route without dst", r.to_string()))?;
        check_token(dst)?;
        let gw = r["gw"]
            .as_str()
            .or(if dst.contains(':') { gw6 } else { gw4 });
        s += &format!("route add {dst}");
        if let Some(g) = gw {
            check_token(g)?;
            s += &format!(" via {g}");
        }
        s += &format!(" dev {ifname}");
        for (key, word) in [
            ("mtu", "mtu"),
            ("advmss", "advmss"),
            ("priority", "metric"),
            ("table", "table"),
            ("scope", "scope"),
        ] {
            if let Some(n) = r[key].as_u64() {
                s += &format!(" {word} {n}");
            }
        }
        s += "\n";
    }
    Ok(s)
}

/// An address or prefix from IPAM goes into an `ip -batch` line: one word of address
/// characters only.
fn check_token(t: &str) -> Result<()> {
    if t.is_empty()
        || !t
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b".:/".contains(&b))
    {
        return Err(failed("IPAM returned an unusable address", t.to_string()));
    }
    Ok(())
}

/// The ADD result in the config's version's format.
fn result(input: &Input, ifaces: Vec<Value>, own: usize, ipam: &Value) -> Value {
    let v = input.version;
    let ips: Vec<Value> = ipam["ips"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut ip| {
            ip["interface"] = json!(own);
            let six = ip["address"].as_str().is_some_and(|a| a.contains(':'));
            match ip.as_object_mut() {
                Some(o) if v < Version::V1_0_0 => {
                    o.insert("version".into(), json!(if six { "6" } else { "4" }));
                }
                Some(o) => {
                    o.remove("version");
                }
                None => {}
            }
            ip
        })
        .collect();
    let mut out = json!({
        "cniVersion": v.as_str(),
        "interfaces": ifaces,
        "ips": ips,
    });
    if let Some(r) = ipam.get("routes").filter(|r| !r.is_null()) {
        out["routes"] = r.clone();
    }
    let dns = ipam
        .get("dns")
        .filter(|d| d.as_object().is_some_and(|o| !o.is_empty()))
        .or(input.conf.dns.as_ref());
    if let Some(d) = dns {
        out["dns"] = d.clone();
    }
    out
}

/// ADD: see the crate docs for what it does, in order; anything it made is undone when a
/// later step fails.
pub fn add(input: &Input) -> Result<Value> {
    let att = Attachment::from_env(true)?;
    let netns = att.netns.clone().expect("ADD has CNI_NETNS");
    if input.conf.prev_result.is_some() {
        return Err(invalid_config(
            "prevResult is set: qswitch-cni creates the interface and must come first in a conflist",
        ));
    }
    if !netns.exists() {
        return Err(CniError::new(
            Code::UnknownContainer,
            "the container's network namespace does not exist",
            format!("CNI_NETNS={}", netns.display()),
        ));
    }
    let control = input.conf.control();
    let names = Names::for_attachment(input, &att);
    let mac = input.conf.mac(&att)?.unwrap_or_else(|| names.mac.clone());
    // The port's keys are checked before anything is made.
    port_config(input, &att, &names, &mac, &[])?;
    // Asks the daemon first, so that an unreachable one changes nothing (code 11).
    if let Some(p) = ports(&control)?.into_iter().find(|p| p.name == names.port) {
        if p.owner.as_ref() != Some(&owner_of(input, &att)) {
            return Err(failed(
                format!("port {} belongs to another attachment", names.port),
                format!("{:?}", p.owner),
            ));
        }
        if input.conf.mode == Mode::Veth && link::exists(Some(&netns), att.ifname.as_str())? {
            return Err(CniError::new(
                Code::AlreadyExists,
                format!("{} already exists in the container", att.ifname),
                format!(
                    "port {} is attached to it; DEL the attachment before adding it again",
                    names.port
                ),
            ));
        }
        // What an interrupted ADD left: removed and made again.
        daemon(&control, &Request::PortDel { name: p.name })?;
    }
    if input.conf.mode == Mode::Veth && link::exists(Some(&netns), att.ifname.as_str())? {
        return Err(CniError::new(
            Code::AlreadyExists,
            format!("{} already exists in the container", att.ifname),
            format!("CNI_NETNS={}", netns.display()),
        ));
    }
    let undo_ipam = || {
        let _ = ipam::run(
            input,
            Call {
                command: "DEL",
                attachment: None,
            },
        );
    };
    let add = Call {
        command: "ADD",
        attachment: None,
    };
    let made = match input.conf.mode {
        Mode::Veth if ipam_needs_link(input) => {
            add_veth_link_first(input, &att, &netns, &names, &mac)
        }
        Mode::Veth => {
            // IPAM and the pair need nothing of each other, nor do the port (with IPAM's
            // addresses) and the container's configuration: two steps of two at once (ADD
            // latency is mostly processes starting, the kernel attaching the port's programs
            // and the daemon saving its state: docs/kubernetes.md).
            let (ipam, pair) = std::thread::scope(|s| {
                let ipam = s.spawn(|| ipam::run(input, add));
                let pair = create_pair(input, &att, &netns, &names, &mac);
                (ipam.join().expect("the IPAM thread does not panic"), pair)
            });
            match (ipam, pair) {
                (Ok(ipam), Ok(())) => add_veth(input, &att, &netns, &names, &mac, &ipam),
                (Ok(_), Err(e)) => Err(e),
                (Err(e), pair) => {
                    if pair.is_ok() {
                        let _ = link::delete(&names.host);
                    }
                    Err(e)
                }
            }
        }
        Mode::VhostUser => ipam::run(input, add)
            .and_then(|ipam| add_vhost_user(input, &att, &netns, &names, &mac, &ipam)),
    };
    // A failed IPAM ADD is followed by its DEL too, as the spec asks of delegation.
    made.inspect_err(|_| undo_ipam())
}

/// The veth pair: `names.host` in the root namespace, `CNI_IFNAME` with its MAC (and both
/// with the MTU) in the container's. The host end stays down: qswitch brings it up once it
/// has sealed it (docs/security.md, F2), and until then nothing the container sends goes
/// anywhere.
fn create_pair(
    input: &Input,
    att: &Attachment,
    netns: &Path,
    names: &Names,
    mac: &str,
) -> Result<()> {
    let ifname = att.ifname.as_str();
    let ns = netns.to_str().ok_or_else(|| {
        CniError::new(
            Code::InvalidEnv,
            "invalid environment",
            "CNI_NETNS is not UTF-8",
        )
    })?;
    if ns.chars().any(char::is_whitespace) {
        return Err(CniError::new(
            Code::InvalidEnv,
            "invalid environment",
            "CNI_NETNS contains whitespace",
        ));
    }
    let mtu = input
        .conf
        .mtu
        .map(|m| format!(" mtu {m}"))
        .unwrap_or_default();
    let host = &names.host;
    link::delete(host)?;
    link::batch(
        None,
        &format!("cannot create the veth pair {host} / {ifname}"),
        &format!(
            "link add name {host}{mtu} type veth peer name {ifname}{mtu} address {mac} netns {ns}\n"
        ),
    )
}

/// Removes the port and the host veth (and with it the container's end).
fn undo_veth(input: &Input, names: &Names) {
    let _ = daemon(
        &input.conf.control(),
        &Request::PortDel {
            name: names.port.clone(),
        },
    );
    let _ = link::delete(&names.host);
}

/// After the pair and IPAM: the port, with IPAM's addresses as its allowed ones under port
/// security, and the container's interface configured (at once: neither needs the other;
/// the host end is down until qswitch has sealed it); the port and the host veth removed
/// when either fails.
fn add_veth(
    input: &Input,
    att: &Attachment,
    netns: &Path,
    names: &Names,
    mac: &str,
    ipam: &Value,
) -> Result<Value> {
    let ifname = att.ifname.as_str();
    let done = netns_script(ifname, ipam).and_then(|script| {
        let (configured, port) = std::thread::scope(|s| {
            let configured = s.spawn(|| {
                link::batch(
                    Some(netns),
                    &format!("cannot configure {ifname} in the container"),
                    &script,
                )
            });
            let port = port_config(input, att, names, mac, &ipam_addrs(ipam))
                .and_then(|port| daemon(&input.conf.control(), &Request::PortAdd { port }));
            (
                configured.join().expect("the netns thread does not panic"),
                port,
            )
        });
        configured.and(port.map(drop))
    });
    if let Err(e) = done {
        undo_veth(input, names);
        return Err(e);
    }
    Ok(veth_result(input, att, netns, names, mac, ipam))
}

/// With port security: the port's allowed addresses become IPAM's.
fn allow_addresses(input: &Input, names: &Names, ipam: &Value) -> Result<()> {
    if !input.conf.port_security {
        return Ok(());
    }
    let addrs = ipam_addrs(ipam);
    let update = serde_json::from_value(json!({ "ips": security_ips(&addrs) }))
        .map_err(|e| failed("IPAM returned an unusable address", e.to_string()))?;
    daemon(
        &input.conf.control(),
        &Request::PortSet {
            name: names.port.clone(),
            update,
        },
    )
    .map(drop)
}

/// ADD for an IPAM plugin that needs the link ([`ipam_needs_link`]), in the order the
/// reference bridge plugin has: the pair, the interface up, the port (port security with the
/// MAC only: a DHCP client sends from 0.0.0.0), IPAM, the addresses and routes, then the
/// port's allowed addresses. Undone (but IPAM, which the caller releases) when a step fails.
fn add_veth_link_first(
    input: &Input,
    att: &Attachment,
    netns: &Path,
    names: &Names,
    mac: &str,
) -> Result<Value> {
    let ifname = att.ifname.as_str();
    let control = input.conf.control();
    create_pair(input, att, netns, names, mac)?;
    let mut port_added = false;
    let done = (|| {
        link::batch(
            Some(netns),
            &format!("cannot bring {ifname} up in the container"),
            &format!("link set dev {ifname} up\n"),
        )?;
        let port = port_config(input, att, names, mac, &[])?;
        daemon(&control, &Request::PortAdd { port })?;
        port_added = true;
        let ipam = ipam::run(
            input,
            Call {
                command: "ADD",
                attachment: None,
            },
        )?;
        link::batch(
            Some(netns),
            &format!("cannot configure {ifname} in the container"),
            &netns_script(ifname, &ipam)?,
        )?;
        allow_addresses(input, names, &ipam)?;
        Ok(ipam)
    })();
    match done {
        Ok(ipam) => Ok(veth_result(input, att, netns, names, mac, &ipam)),
        Err(e) => {
            if port_added {
                let _ = daemon(
                    &control,
                    &Request::PortDel {
                        name: names.port.clone(),
                    },
                );
            }
            let _ = link::delete(&names.host);
            Err(e)
        }
    }
}

/// The ADD result of a veth attachment: the host end, then the container's interface.
fn veth_result(
    input: &Input,
    att: &Attachment,
    netns: &Path,
    names: &Names,
    mac: &str,
    ipam: &Value,
) -> Value {
    let ifname = att.ifname.as_str();
    let host = &names.host;
    let mut container = json!({ "name": ifname, "mac": mac, "sandbox": netns });
    if input.version >= Version::V1_1_0 {
        if let Some(m) = input.conf.mtu {
            container["mtu"] = json!(m);
        }
    }
    let host_if = json!({ "name": host, "mac": link::host_mac(host).unwrap_or_default() });
    result(input, vec![host_if, container], 1, ipam)
}

fn add_vhost_user(
    input: &Input,
    att: &Attachment,
    netns: &Path,
    names: &Names,
    mac: &str,
    ipam: &Value,
) -> Result<Value> {
    let socket = socket_path(input, names);
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(|e| {
            CniError::new(
                Code::Io,
                "cannot create the socket directory",
                format!("{}: {e}", dir.display()),
            )
        })?;
    }
    let port = port_config(input, att, names, mac, &ipam_addrs(ipam))?;
    daemon(&input.conf.control(), &Request::PortAdd { port })?;
    let mut iface = json!({ "name": att.ifname.as_str(), "mac": mac, "sandbox": netns });
    if input.version >= Version::V1_1_0 {
        iface["socketPath"] = json!(socket);
    }
    Ok(result(input, vec![iface], 0, ipam))
}

/// DEL: the port, the host veth (and with it the container's end), the IPAM lease. Each
/// that is missing is fine. When the daemon cannot be reached, the rest is still undone and
/// the answer is "try again later", so the runtime retries and the port goes too.
pub fn del(input: &Input) -> Result<()> {
    let att = Attachment::from_env(false)?;
    let names = Names::for_attachment(input, &att);
    let control = input.conf.control();
    let port = ports(&control).and_then(|ps| match ps.into_iter().find(|p| p.name == names.port) {
        Some(p) => daemon(&control, &Request::PortDel { name: p.name }).map(drop),
        None => Ok(()),
    });
    let host = match input.conf.mode {
        Mode::Veth => link::delete(&names.host),
        // A server socket is qswitch's (the daemon normally removes it with the port); a
        // client one is the pod's.
        Mode::VhostUser if input.conf.vhost_mode.as_deref() == Some("client") => Ok(()),
        Mode::VhostUser => match std::fs::remove_file(socket_path(input, &names)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CniError::new(
                Code::Io,
                "cannot remove the vhost-user socket",
                e.to_string(),
            )),
            _ => Ok(()),
        },
    };
    let lease = ipam::run(
        input,
        Call {
            command: "DEL",
            attachment: None,
        },
    );
    port?;
    host?;
    lease.map(drop)
}

/// CHECK: the port in qswitch as ADD made it, the interfaces and addresses of `prevResult`
/// in place, and the IPAM plugin's own CHECK.
pub fn check(input: &Input) -> Result<()> {
    if input.version < Version::V0_4_0 {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            "incompatible CNI version",
            format!(
                "CHECK needs cniVersion 0.4.0 or later, got {}",
                input.version.as_str()
            ),
        ));
    }
    let att = Attachment::from_env(true)?;
    let netns = att.netns.clone().expect("CHECK has CNI_NETNS");
    let prev = input
        .conf
        .prev_result
        .as_ref()
        .ok_or_else(|| invalid_config("CHECK needs prevResult"))?;
    let names = Names::for_attachment(input, &att);
    let bad = |what: String| CniError::new(Code::CheckFailed, "CHECK failed", what);
    let port = ports(&input.conf.control())?
        .into_iter()
        .find(|p| p.name == names.port)
        .ok_or_else(|| bad(format!("qswitch has no port {}", names.port)))?;
    if port.owner.as_ref() != Some(&owner_of(input, &att)) {
        return Err(bad(format!(
            "port {} has owner {:?}",
            names.port, port.owner
        )));
    }
    if port.vlan != input.conf.vlan {
        return Err(bad(format!(
            "port {} has vlan {:?}, the config {:?}",
            names.port, port.vlan, input.conf.vlan
        )));
    }
    let ifaces = prev["interfaces"].as_array().cloned().unwrap_or_default();
    let own = ifaces
        .iter()
        .position(|i| i["name"] == att.ifname.as_str() && i["sandbox"].as_str().is_some())
        .ok_or_else(|| bad(format!("prevResult has no interface {}", att.ifname)))?;
    let mac = ifaces[own]["mac"].as_str().unwrap_or_default().to_string();
    if input.conf.port_security {
        let macs = port
            .security
            .as_ref()
            .map(|s| s.macs.clone())
            .unwrap_or_default();
        if !macs
            .iter()
            .any(|m| m.to_string().eq_ignore_ascii_case(&mac))
        {
            return Err(bad(format!("port {} does not allow MAC {mac}", names.port)));
        }
    }
    match input.conf.mode {
        Mode::Veth => {
            if !link::exists(None, &names.host)? {
                return Err(bad(format!("the host veth {} is gone", names.host)));
            }
            let st = link::state(Some(&netns), att.ifname.as_str())?
                .ok_or_else(|| bad(format!("{} is gone from the container", att.ifname)))?;
            if !st.mac.eq_ignore_ascii_case(&mac) {
                return Err(bad(format!(
                    "{} has MAC {}, expected {mac}",
                    att.ifname, st.mac
                )));
            }
            if let Some(m) = input.conf.mtu {
                if st.mtu != m {
                    return Err(bad(format!(
                        "{} has MTU {}, expected {m}",
                        att.ifname, st.mtu
                    )));
                }
            }
            for ip in prev["ips"].as_array().cloned().unwrap_or_default() {
                let mine = ip["interface"].as_u64().is_none_or(|i| i as usize == own);
                let Some(a) = ip["address"].as_str() else {
                    continue;
                };
                if mine && !st.addrs.iter().any(|x| x == a) {
                    return Err(bad(format!("{} lacks address {a}", att.ifname)));
                }
            }
        }
        Mode::VhostUser => {
            if port.socket.as_deref() != socket_path(input, &names).to_str() {
                return Err(bad(format!(
                    "port {} has socket {:?}",
                    names.port, port.socket
                )));
            }
        }
    }
    ipam::run(
        input,
        Call {
            command: "CHECK",
            attachment: None,
        },
    )
    .map(drop)
}

/// STATUS: the daemon answers, and so does a delegated IPAM plugin that has STATUS.
pub fn status(input: &Input) -> Result<()> {
    need_1_1(input, "STATUS")?;
    let control = input.conf.control();
    call(&control, &Request::Ping).map_err(|e| {
        CniError::new(
            Code::Unavailable,
            "qswitch is not available",
            format!(
                "{e}; ADD will fail until it answers on {}",
                control.display()
            ),
        )
    })?;
    ipam::forward(input, "STATUS")
}

/// GC: removes this network's ports whose attachments are not in
/// `cni.dev/valid-attachments`, their host veths and IPAM leases; forwards GC to an IPAM
/// plugin that has it. Goes on past errors and reports the first.
pub fn gc(input: &Input) -> Result<()> {
    need_1_1(input, "GC")?;
    let control = input.conf.control();
    let valid = input.conf.valid_attachments.clone().unwrap_or_default();
    let mut first_error = None;
    for p in ports(&control)? {
        let Some(o) = &p.owner else { continue };
        if o.cni != input.conf.name
            || valid
                .iter()
                .any(|v| v.container == o.container && v.ifname == o.ifname)
        {
            continue;
        }
        let r = daemon(
            &control,
            &Request::PortDel {
                name: p.name.clone(),
            },
        )
        .map(drop)
        .and_then(|()| match (&p.ifname, p.kind.as_str()) {
            (Some(host), "veth") => link::delete(host),
            _ => Ok(()),
        })
        .and_then(|()| {
            ipam::run(
                input,
                Call {
                    command: "DEL",
                    attachment: Some((&o.container, &o.ifname)),
                },
            )
            .map(drop)
        });
        if let Err(e) = r {
            first_error.get_or_insert(e);
        }
    }
    if let Err(e) = ipam::forward(input, "GC") {
        first_error.get_or_insert(e);
    }
    first_error.map_or(Ok(()), Err)
}

fn need_1_1(input: &Input, what: &str) -> Result<()> {
    if input.version < Version::V1_1_0 {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            "incompatible CNI version",
            format!(
                "{what} needs cniVersion 1.1.0, got {}",
                input.version.as_str()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_and_are_stable() {
        let n = Names::of("tenant-a", "0123456789abcdef0123456789abcdef", "eth0");
        assert_eq!(
            n,
            Names::of("tenant-a", "0123456789abcdef0123456789abcdef", "eth0")
        );
        assert_ne!(
            n,
            Names::of("tenant-a", "0123456789abcdef0123456789abcdef", "eth1")
        );
        assert_ne!(
            n.port,
            Names::of("tenant-b", "0123456789abcdef0123456789abcdef", "eth0").port
        );
        assert_eq!(n.host.len(), 15);
        assert!(n.port.len() <= qswitch_api::value::MAX_PORT_NAME);
        let first = u8::from_str_radix(&n.mac[..2], 16).unwrap();
        assert_eq!(first & 3, 2, "locally administered unicast: {}", n.mac);
    }

    #[test]
    fn netns_script_uses_family_gateways() {
        let ipam = json!({
            "ips": [
                {"address": "10.1.0.5/24", "gateway": "10.1.0.1"},
                {"address": "fd00::5/64", "gateway": "fd00::1"}
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "priority": 5}]
        });
        let s = netns_script("eth0", &ipam).unwrap();
        assert!(s.contains("addr add 10.1.0.5/24 dev eth0\n"), "{s}");
        assert!(s.contains("addr add fd00::5/64 dev eth0 nodad\n"), "{s}");
        assert!(
            s.contains("route add 0.0.0.0/0 via 10.1.0.1 dev eth0\n"),
            "{s}"
        );
        assert!(
            s.contains("route add ::/0 via fd00::1 dev eth0 metric 5\n"),
            "{s}"
        );
        let evil = json!({"ips": [{"address": "10.0.0.1/24\nlink del lo"}]});
        assert!(netns_script("eth0", &evil).is_err());
    }
}
