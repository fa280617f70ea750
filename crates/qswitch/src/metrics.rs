//! `/metrics`: every counter in the Prometheus text exposition format (version 0.0.4).
//!
//! Names follow the Prometheus conventions: `qswitch_` prefix, base units (seconds, bytes),
//! `_total` on counters, one family per quantity with labels for port, queue, worker, CPU and
//! drop reason. [`FAMILIES`] lists every family; the integration test checks that each one
//! parses and that every counter is non-zero after traffic (except the declared exceptions).

use std::fmt::Write;

use qswitch_api::request::{PlacementReport, PortInfo, StatsReport};

/// (name, type, help) of every family, in output order.
pub const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "qswitch_uptime_seconds",
        "gauge",
        "Seconds since the switch started.",
    ),
    (
        "qswitch_process_cpu_seconds_total",
        "counter",
        "CPU time of the whole daemon process.",
    ),
    (
        "qswitch_port_rx_packets_total",
        "counter",
        "Frames received, per port and rx queue (queue=\"fastpath\": a veth port's kernel fast path).",
    ),
    (
        "qswitch_port_rx_bytes_total",
        "counter",
        "Bytes received, per port and rx queue (queue=\"fastpath\": a veth port's kernel fast path).",
    ),
    (
        "qswitch_port_tx_packets_total",
        "counter",
        "Frames sent to the port.",
    ),
    (
        "qswitch_port_tx_bytes_total",
        "counter",
        "Bytes sent to the port.",
    ),
    (
        "qswitch_port_drops_total",
        "counter",
        "Frames dropped, per port (rx and tx side) and reason.",
    ),
    (
        "qswitch_port_rx_queue_drops_total",
        "counter",
        "Frames dropped on receive, per port, rx queue and reason (part of qswitch_port_drops_total).",
    ),
    (
        "qswitch_port_fdb_entries",
        "gauge",
        "Addresses the MAC table has learned on the port.",
    ),
    (
        "qswitch_port_fdb_refused_total",
        "counter",
        "Addresses the MAC table refused to learn on the port, per reason: limit (the port was \
         at its MAC limit), flap (the address moved between ports too often), held (a VXLAN \
         frame from an unknown VTEP claimed an address live on another port).",
    ),
    (
        "qswitch_port_info",
        "gauge",
        "1 per port, labelled with its type and, for afxdp ports, the data path in use (xdp_mode).",
    ),
    (
        "qswitch_port_disabled",
        "gauge",
        "1 while a port is disabled (reason=\"bpdu_guard\": a BPDU arrived on a port with \
         bpdu_guard) until `qswitch port enable`, else 0.",
    ),
    (
        "qswitch_port_waiting",
        "gauge",
        "1 while a veth or afxdp port is down waiting for its interface (labelled ifname), which \
         did not exist when the daemon started; 0 once it is open.",
    ),
    (
        "qswitch_afxdp_kernel_drops_total",
        "counter",
        "Frames an afxdp port's kernel sockets dropped before qswitch saw them (rx_dropped: no \
         fill buffer or ring space), and invalid descriptors (invalid_descs).",
    ),
    (
        "qswitch_gen_generated_frames_total",
        "counter",
        "Frames a gen port generated.",
    ),
    (
        "qswitch_vxlan_inner_mtu_bytes",
        "gauge",
        "The IP MTU a VXLAN port's VMs must use: the underlay MTU less the tunnel's 50 bytes \
         (IPv4) or 70 (IPv6); larger frames are dropped as mtu_exceeded.",
    ),
    (
        "qswitch_vxlan_rx_packets_total",
        "counter",
        "Inner frames a VXLAN port decapsulated, per port, VNI and remote VTEP (vtep=\"other\": \
         every VTEP that is not configured, static or EVPN's).",
    ),
    (
        "qswitch_vxlan_tx_packets_total",
        "counter",
        "Inner frames a VXLAN port encapsulated, per port, VNI and remote VTEP (vtep=\"other\": \
         every VTEP that is not configured, static or EVPN's).",
    ),
    (
        "qswitch_vxlan_rx_bytes_total",
        "counter",
        "Inner bytes a VXLAN port decapsulated, per port, VNI and remote VTEP (vtep=\"other\": \
         every VTEP that is not configured, static or EVPN's).",
    ),
    (
        "qswitch_vxlan_tx_bytes_total",
        "counter",
        "Inner bytes a VXLAN port encapsulated, per port, VNI and remote VTEP (vtep=\"other\": \
         every VTEP that is not configured, static or EVPN's).",
    ),
    (
        "qswitch_vxlan_learned_entries",
        "gauge",
        "Remote MACs a VXLAN port has learned (at most 4096 per VNI).",
    ),
    (
        "qswitch_vxlan_learn_refused_total",
        "counter",
        "Remote MACs a VXLAN port refused to learn or move, per reason: limit (4096 learned), \
         flap (moved between VTEPs too often), held (a frame from an unknown VTEP claimed a MAC \
         live behind another).",
    ),
    (
        "qswitch_vxlan_drops_total",
        "counter",
        "Frames a VXLAN port dropped, per port and reason (decapsulation and encapsulation).",
    ),
    (
        "qswitch_vxlan_offload_total",
        "counter",
        "A VXLAN port's batching, per port and kind: segmented (TSO frames cut in software), \
         gso_sent (of those, sent with UDP_SEGMENT), udp_gro (received messages holding several \
         datagrams), gro_frames (super-frames built from received TCP segments), gro_segments \
         (segments merged into them).",
    ),
    (
        "qswitch_tap_offload_total",
        "counter",
        "A TAP port's software GRO, per port and kind: gro_frames (TSO super-frames written, \
         built from in-order TCP segments of one flow), gro_segments (segments merged into them).",
    ),
    (
        "qswitch_sink_frames_total",
        "counter",
        "Frames a gen port's sink saw, valid (with a qswitch trailer) or foreign.",
    ),
    (
        "qswitch_sink_lost_frames_total",
        "counter",
        "Sequence numbers a gen sink never saw.",
    ),
    (
        "qswitch_sink_reordered_frames_total",
        "counter",
        "Frames a gen sink saw out of order.",
    ),
    (
        "qswitch_bond_member_enabled",
        "gauge",
        "1 while a bond member carries traffic (carrier, delays, LACP distributing).",
    ),
    (
        "qswitch_bond_member_carrier",
        "gauge",
        "A bond member's carrier (from netlink link events).",
    ),
    (
        "qswitch_bond_member_active",
        "gauge",
        "1 for a bond's active member (active-backup sender, balance-slb flood receiver).",
    ),
    (
        "qswitch_bond_member_packets_total",
        "counter",
        "Frames a bond member received (dir=rx, taken), refused (dir=rx_dropped), sent \
         (dir=tx), and LACPDUs and gratuitous RARPs (dir=lacp_rx, lacp_tx, rarp_tx).",
    ),
    (
        "qswitch_vhost_guest_errors_total",
        "counter",
        "Guest errors on a vhost-user port (bad descriptor chains, stopped rings).",
    ),
    (
        "qswitch_vhost_logged_pages_total",
        "counter",
        "Pages a vhost-user port marked in the dirty log during live migration.",
    ),
    (
        "qswitch_vhost_announces_total",
        "counter",
        "RARP announcements injected for a migrated guest (VHOST_USER_SEND_RARP).",
    ),
    (
        "qswitch_queue_assignment",
        "gauge",
        "1 for each rx queue, labelled with the worker and CPU polling it.",
    ),
    (
        "qswitch_queue_load_ratio",
        "gauge",
        "Fraction of a core an rx queue's bursts took over the last placement evaluation.",
    ),
    (
        "qswitch_placement_moves_total",
        "counter",
        "Rx queue moves between workers (dynamic placement, pins, mode changes).",
    ),
    (
        "qswitch_placement_warnings",
        "gauge",
        "Current placement warnings (overlapping operator CPU sets, sharing forced by too few CPUs, ...).",
    ),
    (
        "qswitch_worker_busy_seconds_total",
        "counter",
        "Time a worker spent in polls that moved frames.",
    ),
    (
        "qswitch_worker_idle_seconds_total",
        "counter",
        "Time a worker spent polling without finding frames.",
    ),
    (
        "qswitch_worker_polls_total",
        "counter",
        "Polls of a worker, by result (busy: moved frames; idle: found none).",
    ),
    (
        "qswitch_worker_sleeps_total",
        "counter",
        "Times a worker went to sleep waiting for frames.",
    ),
    (
        "qswitch_worker_wakeups_total",
        "counter",
        "Times a worker was woken up.",
    ),
    (
        "qswitch_worker_context_switches_total",
        "counter",
        "Context switches of a worker thread, by kind.",
    ),
    (
        "qswitch_worker_cpu_seconds_total",
        "counter",
        "CPU time of a worker thread (user + system).",
    ),
    (
        "qswitch_worker_spin_seconds",
        "gauge",
        "A worker's current adaptive spin window.",
    ),
];

/// (name, type, help) of the mirror sessions' families ([`render_mirrors`]; present when a
/// session runs).
pub const MIRROR_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "qswitch_mirror_copies_total",
        "counter",
        "Frames a mirror session copied into its queue.",
    ),
    (
        "qswitch_mirror_sent_total",
        "counter",
        "Copies a mirror session's output port or collector socket took.",
    ),
    (
        "qswitch_mirror_drops_total",
        "counter",
        "Copies a mirror session lost (queue full, frame larger than a slot, output refused).",
    ),
];

/// The mirror sessions' families, for `/metrics` after [`render`]'s.
pub fn render_mirrors(mirrors: &[qswitch_api::request::MirrorInfo]) -> String {
    let mut o = Out {
        text: String::new(),
    };
    if mirrors.is_empty() {
        return o.text;
    }
    for (name, _, _) in MIRROR_FAMILIES {
        o.family(name);
        for m in mirrors {
            let v = match *name {
                "qswitch_mirror_copies_total" => m.copies,
                "qswitch_mirror_sent_total" => m.sent,
                _ => m.drops,
            };
            o.sample(name, &[("mirror", &m.config.name)], v);
        }
    }
    o.text
}

/// (name, type, help) of the LLDP families ([`render_lldp`]): only when some port runs LLDP.
pub const LLDP_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "qswitch_lldp_neighbors",
        "gauge",
        "LLDP neighbours known on the port (lldp = \"rx\" or \"both\").",
    ),
    (
        "qswitch_lldp_pdus_total",
        "counter",
        "LLDPDUs per port and direction: rx (taken into the table), tx (sent), discarded \
         (malformed, too many neighbours, or the table busy).",
    ),
    (
        "qswitch_lldp_aged_out_total",
        "counter",
        "LLDP neighbours forgotten because their TTL ran out.",
    ),
    (
        "qswitch_lldp_neighbor_info",
        "gauge",
        "1 per LLDP neighbour, labelled with its chassis id, port id, system name, port \
         description and management address.",
    ),
];

/// (name, type, help) of the firewall's families ([`render_firewall`]): only when some
/// port has security groups (or its filter still has connections or counts).
pub const FIREWALL_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "qswitch_firewall_sessions",
        "gauge",
        "Connections the port's filter tracks now.",
    ),
    (
        "qswitch_firewall_new_sessions_total",
        "counter",
        "Connections the port's security group rules opened.",
    ),
    (
        "qswitch_firewall_ct_invalid_total",
        "counter",
        "Frames the port's filter dropped as ct_invalid (malformed, or not a valid next \
         packet of their connection).",
    ),
    (
        "qswitch_firewall_ct_limit_total",
        "counter",
        "New connections the port's filter refused over the switch's or the port's \
         max_sessions (ct_limit).",
    ),
    (
        "qswitch_firewall_rule_hits_total",
        "counter",
        "New connections and stateless frames a security group rule allowed on the port \
         (the rule's own count: other rules' changes keep it; a changed rule starts at 0).",
    ),
    (
        "qswitch_firewall_frames_total",
        "counter",
        "Frames the port's filter allowed or denied, per direction (ingress: toward the \
         port's VM; egress: from it).",
    ),
    (
        "qswitch_firewall_new_sessions_per_second",
        "gauge",
        "Connections the port's security group rules opened in the last second.",
    ),
];

/// The firewall's families, per port of `ct stats`; nothing when no port is filtered.
pub fn render_firewall(ct: &qswitch_api::request::CtStatsReport) -> String {
    let mut o = Out {
        text: String::new(),
    };
    if !ct.enabled || ct.ports.is_empty() {
        return o.text;
    }
    for (name, _, _) in &FIREWALL_FAMILIES[..4] {
        o.family(name);
        for p in &ct.ports {
            let v = match *name {
                "qswitch_firewall_sessions" => u64::from(p.sessions),
                "qswitch_firewall_new_sessions_total" => p.new,
                "qswitch_firewall_ct_invalid_total" => p.ct_invalid,
                _ => p.ct_limit,
            };
            o.sample(name, &[("port", &p.port)], v);
        }
    }
    if !ct.rules.is_empty() {
        o.family("qswitch_firewall_rule_hits_total");
    }
    for r in &ct.rules {
        let index = r.index.to_string();
        o.sample(
            "qswitch_firewall_rule_hits_total",
            &[("port", &r.port), ("group", &r.group), ("index", &index)],
            r.hits,
        );
    }
    let frames = "qswitch_firewall_frames_total";
    o.family(frames);
    for p in &ct.ports {
        for (direction, verdict, v) in [
            ("ingress", "allowed", p.allowed_ingress),
            ("ingress", "denied", p.denied_ingress),
            ("egress", "allowed", p.allowed_egress),
            ("egress", "denied", p.denied_egress),
        ] {
            let labels = [
                ("port", &*p.port),
                ("direction", direction),
                ("verdict", verdict),
            ];
            o.sample(frames, &labels, v);
        }
    }
    let rate = "qswitch_firewall_new_sessions_per_second";
    o.family(rate);
    for p in &ct.ports {
        o.sample(rate, &[("port", &p.port)], p.new_per_s);
    }
    o.text
}

/// Label values escaped as the format requires.
fn esc(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str) {
        if let Some((_, kind, help)) = FAMILIES
            .iter()
            .chain(MIRROR_FAMILIES)
            .chain(LLDP_FAMILIES)
            .chain(FIREWALL_FAMILIES)
            .find(|f| f.0 == name)
        {
            let _ = writeln!(self.text, "# HELP {name} {help}");
            let _ = writeln!(self.text, "# TYPE {name} {kind}");
        }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        debug_assert!(
            FAMILIES
                .iter()
                .chain(MIRROR_FAMILIES)
                .chain(LLDP_FAMILIES)
                .chain(FIREWALL_FAMILIES)
                .any(|f| f.0 == name),
            "undeclared family {name}"
        );
        self.text.push_str(name);
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
                .collect();
            let _ = write!(self.text, "{{{}}}", l.join(","));
        }
        let _ = writeln!(self.text, " {value}");
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The LLDP families, for the ports that run LLDP; nothing when none does.
pub fn render_lldp(lldp: &[qswitch_api::request::LldpPort]) -> String {
    let mut o = Out {
        text: String::new(),
    };
    if lldp.is_empty() {
        return o.text;
    }
    o.family("qswitch_lldp_neighbors");
    for p in lldp {
        o.sample(
            "qswitch_lldp_neighbors",
            &[("port", &p.port)],
            p.neighbors.len(),
        );
    }
    o.family("qswitch_lldp_pdus_total");
    for p in lldp {
        for (dir, v) in [("rx", p.rx), ("tx", p.tx), ("discarded", p.discarded)] {
            o.sample(
                "qswitch_lldp_pdus_total",
                &[("port", &p.port), ("direction", dir)],
                v,
            );
        }
    }
    o.family("qswitch_lldp_aged_out_total");
    for p in lldp {
        o.sample(
            "qswitch_lldp_aged_out_total",
            &[("port", &p.port)],
            p.aged_out,
        );
    }
    o.family("qswitch_lldp_neighbor_info");
    for p in lldp {
        for n in &p.neighbors {
            o.sample(
                "qswitch_lldp_neighbor_info",
                &[
                    ("port", &p.port),
                    ("chassis_id", &n.chassis_id),
                    ("port_id", &n.port_id),
                    ("system_name", n.system_name.as_deref().unwrap_or("")),
                    (
                        "port_description",
                        n.port_description.as_deref().unwrap_or(""),
                    ),
                    (
                        "management_address",
                        n.management_address.as_deref().unwrap_or(""),
                    ),
                ],
                1,
            );
        }
    }
    o.text
}

/// The exposition of `s`, with the queue placement from `ports` and `placement`.
pub fn render(s: &StatsReport, ports: &[PortInfo], placement: &PlacementReport) -> String {
    let mut o = Out {
        text: String::with_capacity(8192),
    };
    o.family("qswitch_uptime_seconds");
    o.sample("qswitch_uptime_seconds", &[], s.uptime_ms as f64 / 1000.0);
    o.family("qswitch_process_cpu_seconds_total");
    o.sample(
        "qswitch_process_cpu_seconds_total",
        &[],
        secs(s.process_cpu_ns),
    );

    for (name, f) in [
        ("qswitch_port_rx_packets_total", 0),
        ("qswitch_port_rx_bytes_total", 1),
    ] {
        o.family(name);
        for p in &s.ports {
            for q in &p.queues {
                let queue = q.queue.to_string();
                let v = if f == 0 { q.rx_packets } else { q.rx_bytes };
                o.sample(name, &[("port", &p.name), ("queue", &queue)], v);
            }
            // A veth port's kernel fast path is a queue of its own here, so that the sum
            // over a port's queues is what it received.
            if let Some(fp) = &p.fastpath {
                let v = if f == 0 { fp.rx_packets } else { fp.rx_bytes };
                o.sample(name, &[("port", &p.name), ("queue", "fastpath")], v);
            }
        }
    }
    for (name, f) in [
        ("qswitch_port_tx_packets_total", 0),
        ("qswitch_port_tx_bytes_total", 1),
    ] {
        o.family(name);
        for p in &s.ports {
            let v = if f == 0 { p.tx_packets } else { p.tx_bytes };
            o.sample(name, &[("port", &p.name)], v);
        }
    }
    o.family("qswitch_port_drops_total");
    for p in &s.ports {
        for (reason, n) in &p.drops {
            o.sample(
                "qswitch_port_drops_total",
                &[("port", &p.name), ("reason", reason)],
                n,
            );
        }
    }
    o.family("qswitch_port_rx_queue_drops_total");
    for p in &s.ports {
        for q in &p.queues {
            let queue = q.queue.to_string();
            for (reason, n) in &q.drops {
                o.sample(
                    "qswitch_port_rx_queue_drops_total",
                    &[("port", &p.name), ("queue", &queue), ("reason", reason)],
                    n,
                );
            }
        }
    }
    o.family("qswitch_port_fdb_entries");
    for p in &s.ports {
        if let Some(f) = &p.fdb {
            o.sample("qswitch_port_fdb_entries", &[("port", &p.name)], f.entries);
        }
    }
    o.family("qswitch_port_fdb_refused_total");
    for p in &s.ports {
        if let Some(f) = &p.fdb {
            for (reason, n) in [
                ("limit", f.limit_refused),
                ("flap", f.flaps),
                ("held", f.moves_held),
            ] {
                o.sample(
                    "qswitch_port_fdb_refused_total",
                    &[("port", &p.name), ("reason", reason)],
                    n,
                );
            }
        }
    }
    o.family("qswitch_port_info");
    for p in ports {
        let mut labels = vec![("port", p.name.as_str()), ("kind", p.kind.as_str())];
        if let Some(m) = &p.xdp_mode {
            labels.push(("xdp_mode", m));
        }
        o.sample("qswitch_port_info", &labels, 1);
    }
    o.family("qswitch_port_disabled");
    for p in ports {
        let mut labels = vec![("port", p.name.as_str())];
        if let Some(why) = &p.disabled {
            labels.push(("reason", why));
        }
        o.sample(
            "qswitch_port_disabled",
            &labels,
            u8::from(p.disabled.is_some()),
        );
    }
    o.family("qswitch_port_waiting");
    for p in ports {
        let mut labels = vec![("port", p.name.as_str())];
        if let Some(ifname) = &p.waiting {
            labels.push(("ifname", ifname));
        }
        o.sample(
            "qswitch_port_waiting",
            &labels,
            u8::from(p.waiting.is_some()),
        );
    }
    o.family("qswitch_afxdp_kernel_drops_total");
    for p in ports {
        if let Some(k) = p.kernel {
            for (reason, v) in [
                ("rx_dropped", k.rx_dropped),
                ("invalid_descs", k.invalid_descs),
            ] {
                o.sample(
                    "qswitch_afxdp_kernel_drops_total",
                    &[("port", &p.name), ("reason", reason)],
                    v,
                );
            }
        }
    }
    o.family("qswitch_vxlan_inner_mtu_bytes");
    for p in ports {
        if let Some(mtu) = p.inner_mtu {
            o.sample("qswitch_vxlan_inner_mtu_bytes", &[("port", &p.name)], mtu);
        }
    }
    let vx: Vec<_> = s
        .ports
        .iter()
        .filter_map(|p| p.vxlan.as_ref().map(|v| (&p.name, v)))
        .collect();
    for (name, f) in [
        ("qswitch_vxlan_rx_packets_total", 0),
        ("qswitch_vxlan_tx_packets_total", 1),
        ("qswitch_vxlan_rx_bytes_total", 2),
        ("qswitch_vxlan_tx_bytes_total", 3),
    ] {
        o.family(name);
        for (port, v) in &vx {
            let vni = v.vni.to_string();
            let field = |t: &qswitch_api::request::VxlanTraffic| {
                [t.rx_packets, t.tx_packets, t.rx_bytes, t.tx_bytes][f]
            };
            for t in &v.vteps {
                let n = field(&t.traffic);
                o.sample(name, &[("port", port), ("vni", &vni), ("vtep", &t.vtep)], n);
            }
            // Unknown senders share one series: spoofed sources cannot add series.
            let n = field(&v.other_vteps);
            o.sample(name, &[("port", port), ("vni", &vni), ("vtep", "other")], n);
        }
    }
    o.family("qswitch_vxlan_learned_entries");
    for (port, v) in &vx {
        o.sample(
            "qswitch_vxlan_learned_entries",
            &[("port", port)],
            v.learned,
        );
    }
    o.family("qswitch_vxlan_learn_refused_total");
    for (port, v) in &vx {
        for (reason, n) in [
            ("limit", v.learn_refused),
            ("flap", v.flaps),
            ("held", v.moves_held),
        ] {
            o.sample(
                "qswitch_vxlan_learn_refused_total",
                &[("port", port), ("reason", reason)],
                n,
            );
        }
    }
    o.family("qswitch_vxlan_drops_total");
    for (port, v) in &vx {
        for (reason, n) in &v.drops {
            o.sample(
                "qswitch_vxlan_drops_total",
                &[("port", port), ("reason", reason)],
                n,
            );
        }
    }
    o.family("qswitch_vxlan_offload_total");
    for (port, v) in &vx {
        for (kind, n) in [
            ("segmented", v.segmented),
            ("gso_sent", v.gso_sent),
            ("udp_gro", v.udp_gro),
            ("gro_frames", v.gro_frames),
            ("gro_segments", v.gro_segments),
        ] {
            o.sample(
                "qswitch_vxlan_offload_total",
                &[("port", port), ("kind", kind)],
                n,
            );
        }
    }
    o.family("qswitch_tap_offload_total");
    for p in &s.ports {
        if let Some(t) = &p.tap {
            for (kind, n) in [
                ("gro_frames", t.gro_frames),
                ("gro_segments", t.gro_segments),
            ] {
                o.sample(
                    "qswitch_tap_offload_total",
                    &[("port", &p.name), ("kind", kind)],
                    n,
                );
            }
        }
    }
    o.family("qswitch_gen_generated_frames_total");
    for p in &s.ports {
        if let Some(g) = p.generated {
            o.sample(
                "qswitch_gen_generated_frames_total",
                &[("port", &p.name)],
                g,
            );
        }
    }
    let sinks: Vec<_> = s
        .ports
        .iter()
        .filter_map(|p| p.sink.as_ref().map(|k| (&p.name, k)))
        .collect();
    o.family("qswitch_sink_frames_total");
    for (port, k) in &sinks {
        for (kind, v) in [("valid", k.received), ("foreign", k.foreign)] {
            o.sample(
                "qswitch_sink_frames_total",
                &[("port", port), ("kind", kind)],
                v,
            );
        }
    }
    o.family("qswitch_sink_lost_frames_total");
    for (port, k) in &sinks {
        o.sample("qswitch_sink_lost_frames_total", &[("port", port)], k.lost);
    }
    o.family("qswitch_sink_reordered_frames_total");
    for (port, k) in &sinks {
        o.sample(
            "qswitch_sink_reordered_frames_total",
            &[("port", port)],
            k.reordered,
        );
    }
    let bonds = || s.ports.iter().filter_map(|p| p.bond.as_ref());
    // Only where a bond exists (a family without samples would read as a counter that
    // never counts).
    if bonds().next().is_some() {
        o.family("qswitch_bond_member_enabled");
        for b in bonds() {
            for m in &b.members {
                let l = [("port", b.name.as_str()), ("member", m.name.as_str())];
                o.sample("qswitch_bond_member_enabled", &l, u8::from(m.enabled));
            }
        }
        o.family("qswitch_bond_member_carrier");
        for b in bonds() {
            for m in &b.members {
                let l = [("port", b.name.as_str()), ("member", m.name.as_str())];
                o.sample("qswitch_bond_member_carrier", &l, u8::from(m.carrier));
            }
        }
        o.family("qswitch_bond_member_active");
        for b in bonds() {
            for m in &b.members {
                let l = [("port", b.name.as_str()), ("member", m.name.as_str())];
                let active = b.active.as_deref() == Some(m.name.as_str());
                o.sample("qswitch_bond_member_active", &l, u8::from(active));
            }
        }
        o.family("qswitch_bond_member_packets_total");
        for b in bonds() {
            for m in &b.members {
                for (dir, n) in [
                    ("rx", m.rx_packets),
                    ("rx_dropped", m.rx_dropped),
                    ("tx", m.tx_packets),
                    ("lacp_rx", m.lacp_rx),
                    ("lacp_tx", m.lacp_tx),
                    ("rarp_tx", m.rarp_tx),
                ] {
                    let l = [
                        ("port", b.name.as_str()),
                        ("member", m.name.as_str()),
                        ("dir", dir),
                    ];
                    o.sample("qswitch_bond_member_packets_total", &l, n);
                }
            }
        }
    }
    o.family("qswitch_vhost_guest_errors_total");
    for p in &s.ports {
        if let Some(e) = p.guest_errors {
            o.sample("qswitch_vhost_guest_errors_total", &[("port", &p.name)], e);
        }
    }
    o.family("qswitch_vhost_logged_pages_total");
    for p in &s.ports {
        if let Some(n) = p.logged_pages {
            o.sample("qswitch_vhost_logged_pages_total", &[("port", &p.name)], n);
        }
    }
    o.family("qswitch_vhost_announces_total");
    for p in &s.ports {
        if let Some(n) = p.announces {
            o.sample("qswitch_vhost_announces_total", &[("port", &p.name)], n);
        }
    }
    o.family("qswitch_queue_assignment");
    for p in ports {
        for q in &p.queues {
            let (queue, worker, cpu) =
                (q.queue.to_string(), q.worker.to_string(), q.cpu.to_string());
            o.sample(
                "qswitch_queue_assignment",
                &[
                    ("port", &p.name),
                    ("queue", &queue),
                    ("worker", &worker),
                    ("cpu", &cpu),
                ],
                1,
            );
        }
    }
    o.family("qswitch_queue_load_ratio");
    for q in &placement.queues {
        let queue = q.queue.to_string();
        o.sample(
            "qswitch_queue_load_ratio",
            &[("port", &q.port), ("queue", &queue)],
            q.load,
        );
    }
    o.family("qswitch_placement_moves_total");
    o.sample("qswitch_placement_moves_total", &[], placement.moves_total);
    o.family("qswitch_placement_warnings");
    o.sample("qswitch_placement_warnings", &[], placement.warnings.len());

    let workers: Vec<(String, String, _)> = s
        .workers
        .iter()
        .map(|w| (w.id.to_string(), w.cpu.to_string(), w))
        .collect();
    let per_worker =
        |o: &mut Out, name: &str, f: &dyn Fn(&qswitch_api::request::WorkerStats) -> String| {
            o.family(name);
            for (id, cpu, w) in &workers {
                o.sample(name, &[("worker", id), ("cpu", cpu)], f(w));
            }
        };
    per_worker(&mut o, "qswitch_worker_busy_seconds_total", &|w| {
        secs(w.busy_ns).to_string()
    });
    per_worker(&mut o, "qswitch_worker_idle_seconds_total", &|w| {
        secs(w.idle_ns).to_string()
    });
    o.family("qswitch_worker_polls_total");
    for (id, cpu, w) in &workers {
        for (result, v) in [("busy", w.busy_polls), ("idle", w.idle_polls)] {
            o.sample(
                "qswitch_worker_polls_total",
                &[("worker", id), ("cpu", cpu), ("result", result)],
                v,
            );
        }
    }
    per_worker(&mut o, "qswitch_worker_sleeps_total", &|w| {
        w.sleeps.to_string()
    });
    per_worker(&mut o, "qswitch_worker_wakeups_total", &|w| {
        w.wakeups.to_string()
    });
    o.family("qswitch_worker_context_switches_total");
    for (id, cpu, w) in &workers {
        for (kind, v) in [
            ("voluntary", w.voluntary_ctx_switches),
            ("involuntary", w.involuntary_ctx_switches),
        ] {
            o.sample(
                "qswitch_worker_context_switches_total",
                &[("worker", id), ("cpu", cpu), ("kind", kind)],
                v,
            );
        }
    }
    per_worker(&mut o, "qswitch_worker_cpu_seconds_total", &|w| {
        secs(w.cpu_ns).to_string()
    });
    per_worker(&mut o, "qswitch_worker_spin_seconds", &|w| {
        (w.spin_us / 1e6).to_string()
    });
    o.text
}

#[cfg(test)]
mod tests {
    use super::*;
    use qswitch_api::request::{PortStats, QueueInfo, QueuePlacementInfo, QueueStats, WorkerStats};

    #[test]
    fn renders_every_family_with_labels() {
        let s = StatsReport {
            uptime_ms: 1500,
            process_cpu_ns: 2_000_000_000,
            ports: vec![
                PortStats {
                    name: "a\"b".into(),
                    tx_packets: 7,
                    drops: [("tx_full".to_string(), 3)].into(),
                    queues: vec![QueueStats {
                        queue: 1,
                        rx_packets: 5,
                        rx_bytes: 320,
                        ..Default::default()
                    }],
                    fdb: Some(qswitch_api::request::PortFdbStats {
                        entries: 4096,
                        limit: 4096,
                        limit_refused: 15_904,
                        flaps: 0,
                        moves_held: 2,
                    }),
                    vxlan: Some(qswitch_api::request::VxlanStats {
                        vni: 100,
                        vteps: vec![qswitch_api::request::VtepStats {
                            vtep: "192.0.2.2".into(),
                            traffic: qswitch_api::request::VxlanTraffic {
                                rx_packets: 1,
                                ..Default::default()
                            },
                        }],
                        other_vteps: qswitch_api::request::VxlanTraffic {
                            rx_packets: 6000,
                            ..Default::default()
                        },
                        learned: 4096,
                        learn_refused: 15_904,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                PortStats {
                    name: "b".into(),
                    bond: Some(qswitch_api::bond::BondInfo {
                        name: "b".into(),
                        mode: qswitch_api::BondMode::ActiveBackup,
                        lacp: qswitch_api::LacpMode::Off,
                        lacp_rate: qswitch_api::LacpRate::Slow,
                        active: Some("eth1".into()),
                        members: vec![qswitch_api::bond::BondMemberInfo {
                            name: "eth1".into(),
                            carrier: true,
                            enabled: true,
                            buckets: 0,
                            rx_packets: 0,
                            tx_packets: 9,
                            rx_dropped: 0,
                            lacp_rx: 0,
                            lacp_tx: 0,
                            rarp_tx: 1,
                            lacp_state: None,
                        }],
                    }),
                    ..Default::default()
                },
                PortStats {
                    name: "v".into(),
                    queues: vec![QueueStats::default()],
                    fastpath: Some(qswitch_api::request::FastPathStats {
                        rx_packets: 11,
                        rx_bytes: 700,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            workers: vec![WorkerStats {
                id: 0,
                cpu: 1,
                busy_ns: 1_500_000_000,
                voluntary_ctx_switches: 9,
                ..Default::default()
            }],
            rates: None,
        };
        let gen = PortInfo {
            name: "a\"b".into(),
            kind: "gen".into(),
            ifname: None,
            vlan: None,
            mac: None,
            created: false,
            offloads: vec![],
            socket: None,
            mode: None,
            connected: None,
            enabled_queues: None,
            dirty_log: None,
            vlans: None,
            security: None,
            storm: None,
            link_local_forward: None,
            bpdu_guard: false,
            disabled: None,
            waiting: None,
            queues: vec![QueueInfo {
                queue: 1,
                worker: 0,
                cpu: 1,
            }],
            xdp_mode: None,
            inner_mtu: None,
            kernel: None,
            fastpath: None,
            owner: None,
        };
        let mut up = gen.clone();
        up.name = "up".into();
        up.kind = "afxdp".into();
        up.xdp_mode = Some("native-copy".into());
        up.kernel = Some(qswitch_api::request::KernelDrops {
            rx_dropped: 4,
            invalid_descs: 0,
        });
        let mut vx = gen.clone();
        vx.name = "vx".into();
        vx.kind = "vxlan".into();
        vx.inner_mtu = Some(1450);
        let ports = vec![gen, up, vx];
        let placement = PlacementReport {
            mode: "dynamic".into(),
            reserved_cpus: vec![],
            queues: vec![QueuePlacementInfo {
                port: "a\"b".into(),
                queue: 1,
                worker: Some(0),
                cpu: Some(1),
                home_cpu: Some(1),
                load: 0.25,
                state: "home".into(),
                why: String::new(),
            }],
            workers: vec![],
            port_sets: vec![],
            warnings: vec!["w".into()],
            moves: vec![],
            moves_total: 3,
        };
        let t = render(&s, &ports, &placement);
        for (name, kind, _) in FAMILIES {
            assert!(t.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        assert!(t.contains("qswitch_uptime_seconds 1.5\n"));
        assert!(
            t.contains("qswitch_port_rx_packets_total{port=\"a\\\"b\",queue=\"1\"} 5\n"),
            "{t}"
        );
        assert!(t.contains("qswitch_port_drops_total{port=\"a\\\"b\",reason=\"tx_full\"} 3\n"));
        assert!(t.contains(
            "qswitch_bond_member_packets_total{port=\"b\",member=\"eth1\",dir=\"tx\"} 9\n"
        ));
        assert!(t.contains("qswitch_bond_member_active{port=\"b\",member=\"eth1\"} 1\n"));
        // A veth port's fast path is a queue of its own.
        assert!(t.contains("qswitch_port_rx_packets_total{port=\"v\",queue=\"fastpath\"} 11\n"));
        assert!(t.contains("qswitch_port_rx_bytes_total{port=\"v\",queue=\"fastpath\"} 700\n"));
        assert!(!t.contains("port=\"a\\\"b\",queue=\"fastpath\""));
        assert!(t.contains("qswitch_worker_busy_seconds_total{worker=\"0\",cpu=\"1\"} 1.5\n"));
        assert!(t.contains(
            "qswitch_worker_context_switches_total{worker=\"0\",cpu=\"1\",kind=\"voluntary\"} 9\n"
        ));
        assert!(t.contains(
            "qswitch_queue_assignment{port=\"a\\\"b\",queue=\"1\",worker=\"0\",cpu=\"1\"} 1\n"
        ));
        assert!(t.contains("qswitch_queue_load_ratio{port=\"a\\\"b\",queue=\"1\"} 0.25\n"));
        assert!(t.contains("qswitch_placement_moves_total 3\n"));
        assert!(
            t.contains("qswitch_port_info{port=\"a\\\"b\",kind=\"gen\"} 1\n"),
            "{t}"
        );
        assert!(t.contains(
            "qswitch_port_info{port=\"up\",kind=\"afxdp\",xdp_mode=\"native-copy\"} 1\n"
        ));
        assert!(
            t.contains("qswitch_afxdp_kernel_drops_total{port=\"up\",reason=\"rx_dropped\"} 4\n")
        );
        assert!(t.contains("qswitch_vxlan_inner_mtu_bytes{port=\"vx\"} 1450\n"));
        assert!(!t.contains("qswitch_vxlan_inner_mtu_bytes{port=\"up\"}"));
        assert!(t.contains("qswitch_placement_warnings 1\n"));
        // F11 (issue 27): fdb refusals per port; unknown VTEPs under one label.
        assert!(
            t.contains("qswitch_port_fdb_refused_total{port=\"a\\\"b\",reason=\"limit\"} 15904\n")
        );
        assert!(t.contains("qswitch_port_fdb_refused_total{port=\"a\\\"b\",reason=\"held\"} 2\n"));
        assert!(t.contains("qswitch_port_fdb_entries{port=\"a\\\"b\"} 4096\n"));
        assert!(t.contains(
            "qswitch_vxlan_rx_packets_total{port=\"a\\\"b\",vni=\"100\",vtep=\"other\"} 6000\n"
        ));
        assert!(t.contains(
            "qswitch_vxlan_rx_packets_total{port=\"a\\\"b\",vni=\"100\",vtep=\"192.0.2.2\"} 1\n"
        ));
        assert!(t.contains(
            "qswitch_vxlan_learn_refused_total{port=\"a\\\"b\",reason=\"limit\"} 15904\n"
        ));
        assert!(t
            .lines()
            .all(|l| l.starts_with('#') || l.starts_with("qswitch_")));
    }

    #[test]
    fn renders_mirror_sessions() {
        assert_eq!(render_mirrors(&[]), "");
        let config = qswitch_api::config::MirrorConfig {
            name: "ids".into(),
            sources: vec!["a".into()],
            direction: Default::default(),
            vlans: None,
            output: Some("m".into()),
            remote: None,
        };
        let t = render_mirrors(&[qswitch_api::request::MirrorInfo {
            config,
            copies: 7,
            sent: 5,
            drops: 2,
        }]);
        for (name, kind, _) in MIRROR_FAMILIES {
            assert!(t.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        assert!(
            t.contains("qswitch_mirror_copies_total{mirror=\"ids\"} 7\n"),
            "{t}"
        );
        assert!(
            t.contains("qswitch_mirror_sent_total{mirror=\"ids\"} 5\n"),
            "{t}"
        );
        assert!(
            t.contains("qswitch_mirror_drops_total{mirror=\"ids\"} 2\n"),
            "{t}"
        );
    }

    #[test]
    fn lldp_families_only_with_lldp_ports() {
        use qswitch_api::request::{LldpNeighbor, LldpPort};
        assert_eq!(render_lldp(&[]), "");
        let p = LldpPort {
            port: "up".into(),
            ifname: "eth1".into(),
            mode: "rx".into(),
            rx: 3,
            tx: 0,
            discarded: 1,
            aged_out: 2,
            neighbors: vec![LldpNeighbor {
                chassis_id: "02:00:00:00:00:01".into(),
                port_id: "swp1".into(),
                system_name: Some("tor\"1".into()),
                port_description: None,
                system_description: None,
                management_address: Some("192.0.2.9".into()),
                source_mac: "02:00:00:00:00:01".into(),
                ttl: 120,
                ttl_remaining_s: 100,
            }],
        };
        let t = render_lldp(&[p]);
        for (name, kind, _) in LLDP_FAMILIES {
            assert!(t.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        assert!(t.contains("qswitch_lldp_neighbors{port=\"up\"} 1\n"), "{t}");
        assert!(t.contains("qswitch_lldp_pdus_total{port=\"up\",direction=\"discarded\"} 1\n"));
        assert!(t.contains(
            "qswitch_lldp_neighbor_info{port=\"up\",chassis_id=\"02:00:00:00:00:01\",port_id=\"swp1\",system_name=\"tor\\\"1\",port_description=\"\",management_address=\"192.0.2.9\"} 1\n"
        ), "{t}");
    }

    #[test]
    fn firewall_families_only_with_filtered_ports() {
        use qswitch_api::request::{CtPortStats, CtStatsReport};
        assert_eq!(render_firewall(&CtStatsReport::default()), "");
        let ct = CtStatsReport {
            enabled: true,
            sessions: 3,
            max_sessions: 100,
            memory_bytes: 1 << 20,
            ports: vec![CtPortStats {
                port: "vm\"1".into(),
                sessions: 3,
                max_sessions: Some(10),
                new: 12,
                ct_invalid: 4,
                ct_limit: 2,
                ct_fragment: 1,
                allowed_ingress: 20,
                allowed_egress: 21,
                denied_ingress: 5,
                denied_egress: 6,
                new_per_s: 2,
            }],
            rules: vec![qswitch_api::request::CtRuleHits {
                port: "vm\"1".into(),
                group: "web".into(),
                index: 2,
                hits: 9,
            }],
        };
        let t = render_firewall(&ct);
        for (name, kind, _) in FIREWALL_FAMILIES {
            assert!(t.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        for line in [
            "qswitch_firewall_sessions{port=\"vm\\\"1\"} 3\n",
            "qswitch_firewall_new_sessions_total{port=\"vm\\\"1\"} 12\n",
            "qswitch_firewall_ct_invalid_total{port=\"vm\\\"1\"} 4\n",
            "qswitch_firewall_ct_limit_total{port=\"vm\\\"1\"} 2\n",
            "qswitch_firewall_rule_hits_total{port=\"vm\\\"1\",group=\"web\",index=\"2\"} 9\n",
            "qswitch_firewall_frames_total{port=\"vm\\\"1\",direction=\"ingress\",verdict=\"allowed\"} 20\n",
            "qswitch_firewall_frames_total{port=\"vm\\\"1\",direction=\"ingress\",verdict=\"denied\"} 5\n",
            "qswitch_firewall_frames_total{port=\"vm\\\"1\",direction=\"egress\",verdict=\"allowed\"} 21\n",
            "qswitch_firewall_frames_total{port=\"vm\\\"1\",direction=\"egress\",verdict=\"denied\"} 6\n",
            "qswitch_firewall_new_sessions_per_second{port=\"vm\\\"1\"} 2\n",
        ] {
            assert!(t.contains(line), "{line} not in {t}");
        }
    }
}
