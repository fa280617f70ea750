//! Cost of the forwarding engine on one core, with test-double ports around it: bursts of 32
//! frames injected on port `a` of a manual switch ([`Switch::manual`], no threads) and
//! switched to port `b` (known unicast) or flooded to `b` and `c` (broadcast). The inject
//! ports copy frames in and out (an allocation each), so for the engine alone take the
//! instructions of `Forwarder::poll` less its ports' `rx_burst` and `tx_burst`
//! (`bench/cg_engine.py` does, from a callgrind profile of this bench).
//!
//! `ipfix_unicast` and `ipfix_unicast_10k` switch known unicast UDP frames with IPFIX export
//! on at sampling 1 (the tap's cost per frame): 4 flows interleaved frame by frame, as the
//! DPDK load generator sends them (`bench/dpdk-load/qsload.c`), and 10 000 flows (one flow a
//! frame, round robin, more than the cache holds in a set's neighbourhood of the L1).
//!
//! `engine/unicast_fw50` is `unicast` with the firewall on both ports (a group of 50 rules
//! where, in each direction, only the last matches: 24 TCP rules, then UDP), the frames
//! UDP of 10 000 flows, so after the first round every frame is a packet of a tracked
//! connection, checked by `a`'s egress filter on the way in and `b`'s ingress filter on
//! the way out (docs/firewall.md).
//!
//! `engine/new_fw50` is `unicast_fw50` with every frame a new connection (its source
//! address and port counted up; `max_sessions` 16 Mi, so nothing is refused within a run)
//! and `bench pvp --firewall`'s group (everything out; in, 49 TCP and UDP rules the load
//! never matches before the UDP rule that does): the new-connection path of both filters,
//! as `bench pvp --firewall --new-flows` drives it.
//!
//! Reported per burst of 32 frames (Criterion's throughput is frames/s).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qswitch_dp::export::{CacheConfig, TapConfig};
use qswitch_dp::packet::BURST;
use qswitch_dp::{Options, Switch};

fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f
}

/// A 60-byte IPv4/UDP frame of flow `flow` (its UDP source port), as qsload sends: the IPFIX
/// and firewall cases' frames.
fn udp_frame(dst: [u8; 6], src: [u8; 6], flow: u16) -> Vec<u8> {
    let mut f = frame(dst, src);
    // IPv4: version 4, header 20 bytes, total length 46, TTL 64, UDP, 10.0.0.1 -> 10.0.0.2.
    f[14] = 0x45;
    f[16..18].copy_from_slice(&46u16.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    f[34..36].copy_from_slice(&(1024 + flow).to_be_bytes());
    f[36..38].copy_from_slice(&9u16.to_be_bytes());
    f[38..40].copy_from_slice(&26u16.to_be_bytes());
    f
}

fn bench(c: &mut Criterion) {
    let (ma, mb) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
    let options = Options {
        topology: Some(qswitch_dp::control::placement::Topology::synthetic(1, 4, 1)),
        ..Options::default()
    };
    let sw = Switch::manual(&[0], &options).unwrap();
    let a = sw.add_inject_port("a", None).unwrap();
    let b = sw.add_inject_port("b", None).unwrap();
    let cp = sw.add_inject_port("c", None).unwrap();
    let mut now = 0;
    // b is known.
    b.inject(&frame(ma, mb));
    while b.pending() > 0 {
        now += 1_000;
        sw.poll_once(now);
    }
    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Elements(BURST as u64));
    for (name, dst) in [("unicast", mb), ("broadcast", [0xff; 6])] {
        let f = frame(dst, ma);
        group.bench_function(name, |bench| {
            bench.iter(|| {
                for _ in 0..BURST {
                    a.inject(&f);
                }
                while a.pending() > 0 {
                    // The clock moves slowly: the fdb caches stay warm as under load.
                    now += 1;
                    sw.poll_once(now);
                }
                b.take_captured();
                cp.take_captured();
            })
        });
    }
    // IPFIX at 1:1, the cache as the daemon sizes it (`CACHE_FLOWS` in crates/qswitch/src/export.rs).
    sw.set_export(Some(TapConfig {
        ipfix: Some(CacheConfig {
            capacity: 16_384,
            sampling: 1,
            active_timeout_ms: 60_000,
            idle_timeout_ms: 15_000,
        }),
        sflow: None,
    }));
    for (name, flows) in [("ipfix_unicast", 4u16), ("ipfix_unicast_10k", 10_000)] {
        let frames: Vec<Vec<u8>> = (0..flows).map(|i| udp_frame(mb, ma, i)).collect();
        let mut next = 0;
        group.bench_function(name, |bench| {
            bench.iter(|| {
                for _ in 0..BURST {
                    a.inject(&frames[next]);
                    next = (next + 1) % frames.len();
                }
                while a.pending() > 0 {
                    now += 1;
                    sw.poll_once(now);
                }
                b.take_captured();
            })
        });
    }
    firewall_case(&mut group);
    group.finish();
}

/// Flows of `unicast_fw50`.
const FLOWS: u16 = 10_000;

fn firewall_case(group: &mut criterion::BenchmarkGroup<criterion::measurement::WallTime>) {
    firewall_case_with(group, false);
    firewall_case_with(group, true);
}

/// `unicast_fw50`, or with `new_flows` `new_fw50`.
fn firewall_case_with(
    group: &mut criterion::BenchmarkGroup<criterion::measurement::WallTime>,
    new_flows: bool,
) {
    let mut rules = String::new();
    if new_flows {
        // `bench pvp --firewall`'s group (crates/lab/src/bench/fw.rs): everything out, then
        // 49 ingress rules the load never matches (TCP ports, and UDP ports from other
        // networks), then UDP to the load's port.
        rules.push_str("{ direction = \"egress\" },\n");
        for i in 0..49 {
            rules.push_str(&if i % 2 == 0 {
                format!(
                    "{{ direction = \"ingress\", protocol = \"tcp\", ports = \"{}\" }},\n",
                    2000 + i
                )
            } else {
                format!(
                    "{{ direction = \"ingress\", protocol = \"udp\", ports = \"{}\", \
                     remote = \"192.168.{i}.0/24\" }},\n",
                    3000 + i
                )
            });
        }
        rules.push_str("{ direction = \"ingress\", protocol = \"udp\", ports = \"9\" },\n");
    } else {
        for direction in ["egress", "ingress"] {
            for i in 0..24 {
                rules.push_str(&format!(
                    "{{ direction = \"{direction}\", protocol = \"tcp\", ports = {} }},\n",
                    1000 + i
                ));
            }
        }
        rules.push_str("{ direction = \"egress\", protocol = \"udp\" },\n");
        rules.push_str("{ direction = \"ingress\", protocol = \"udp\" },\n");
    }
    let text = format!(
        "[[security_group]]\nname = \"g\"\nrules = [\n{rules}]\n\
         [[port]]\nname = \"a\"\ntype = \"gen\"\nsecurity_groups = [\"g\"]\n\
         [[port]]\nname = \"b\"\ntype = \"gen\"\nsecurity_groups = [\"g\"]\n\
         [firewall]\nmax_sessions = {}\n",
        if new_flows {
            1u32 << 24
        } else {
            qswitch_dp::firewall::DEFAULT_MAX_SESSIONS
        }
    );
    let config = qswitch_api::config::Config::from_toml(&text).unwrap();
    let options = Options {
        topology: Some(qswitch_dp::control::placement::Topology::synthetic(1, 4, 1)),
        firewall: config.firewall,
        security_groups: config.security_groups.clone(),
        ..Options::default()
    };
    let sw = Switch::manual(&[0], &options).unwrap();
    let a = sw.add_inject_port_config(&config.ports[0]).unwrap();
    let b = sw.add_inject_port_config(&config.ports[1]).unwrap();
    let (ma, mb) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
    let mut now = 0;
    // b is known (its frame opens a connection of its own).
    b.inject(&udp_frame(ma, mb, FLOWS));
    while b.pending() > 0 {
        now += 1_000;
        sw.poll_once(now);
    }
    if new_flows {
        // Source 10.128.0.0/9 and port 1024..=65535 counted up: a new 5-tuple a frame.
        let mut f = udp_frame(mb, ma, 0);
        let mut n: u64 = 0;
        group.bench_function("new_fw50", |bench| {
            bench.iter(|| {
                for _ in 0..BURST {
                    let port = 1024 + (n % 64_512) as u16;
                    let host = 0x0a80_0000 | ((n / 64_512) as u32 & 0x7f_ffff);
                    f[26..30].copy_from_slice(&host.to_be_bytes());
                    f[34..36].copy_from_slice(&port.to_be_bytes());
                    a.inject(&f);
                    n += 1;
                }
                while a.pending() > 0 {
                    now += 1;
                    sw.poll_once(now);
                }
                b.take_captured();
            })
        });
        return;
    }
    let frames: Vec<Vec<u8>> = (0..FLOWS).map(|i| udp_frame(mb, ma, i)).collect();
    let mut next = 0usize;
    group.bench_function("unicast_fw50", |bench| {
        bench.iter(|| {
            for _ in 0..BURST {
                a.inject(&frames[next]);
                next = (next + 1) % frames.len();
            }
            while a.pending() > 0 {
                now += 1;
                sw.poll_once(now);
            }
            b.take_captured();
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
