//! Cost of the firewall's verdict (docs/firewall.md): a packet of an established connection
//! with 1 k and 1 M connections in the table (keys visited in a scattered order, so the big
//! table is not flattered by the cache), a new connection (each frame a new flow) with one
//! rule and with 50 rules of which only the last matches, and `ct::parse` alone for
//! reference. Prints the table's memory per session once.
//!
//! `cargo bench --profile release -p qswitch-dp --bench firewall` (the release profile: the
//! bench profile's LTO would rebuild every dependency).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qswitch_api::config::{Config, RuleDirection};
use qswitch_dp::firewall::Firewall;

const SEC: u64 = 1_000_000_000;

/// A UDP frame from the VM (10.0.0.5) to flow `i`'s address and source port.
fn frame() -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0, 0, 32, 0, 1, 0, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 0, 0, 5, 198, 18, 0, 0]);
    f.extend_from_slice(&[0, 0, 0, 53, 0, 12, 0, 0, 0, 0, 0, 0]);
    f.resize(60, 0);
    f
}

/// Makes `f` the frame of flow `i` (up to 2^24 flows: 65 536 addresses × 256 ports).
fn set_flow(f: &mut [u8], i: u32) {
    let b = i.to_be_bytes();
    f[32] = b[2];
    f[33] = b[3];
    f[34..36].copy_from_slice(&(1024 + u16::from(b[1])).to_be_bytes());
}

fn firewall(rules: &str, max_sessions: u32) -> Firewall {
    let text = format!(
        "[firewall]\nmax_sessions = {max_sessions}\n[[security_group]]\nname = \"g\"\n\
         rules = [\n{rules}\n]\n[[port]]\nname = \"vm\"\ntype = \"gen\"\nsecurity_groups = [\"g\"]\n"
    );
    Firewall::from_config(&Config::from_toml(&text).unwrap()).unwrap()
}

/// A walk over 0..n that is not sequential (n a power of two, step odd).
fn scatter(i: u32, n: u32) -> u32 {
    i.wrapping_mul(2_654_435_761) & (n - 1)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("firewall");
    group.throughput(Throughput::Elements(1));
    let mut f = frame();
    for n in [1u32 << 10, 1 << 20] {
        let fw = firewall(r#"{ direction = "egress" },"#, n + n / 4);
        for i in 0..n {
            set_flow(&mut f, i);
            assert!(fw.check(0, RuleDirection::Egress, &f, SEC).allowed());
        }
        if n == 1 << 20 {
            let bytes = fw.table().memory_bytes();
            eprintln!(
                "firewall: table for {} sessions: {} MiB, {} bytes per session ({} entries allocated)",
                fw.table().max_sessions(),
                bytes >> 20,
                bytes / fw.table().max_sessions() as usize,
                fw.table().capacity()
            );
        }
        let mut i = 0u32;
        group.bench_function(BenchmarkId::new("established", n), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                set_flow(&mut f, scatter(i, n));
                fw.check(0, RuleDirection::Egress, black_box(&f), SEC)
            })
        });
    }
    let mut rules50 = String::new();
    for i in 0..49 {
        rules50.push_str(&format!(
            "{{ direction = \"egress\", protocol = \"tcp\", ports = {} }},\n",
            1000 + i
        ));
    }
    rules50.push_str(r#"{ direction = "egress", protocol = "udp", ports = 53 },"#);
    for (name, rules) in [
        ("new_1_rule", r#"{ direction = "egress" },"#),
        ("new_50_rules", &rules50),
    ] {
        let max = 1 << 20;
        let fw = firewall(rules, max);
        let mut i = 0u32;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) & ((1 << 24) - 1);
                if fw.table().len() >= max {
                    // Room for the next million (amortised: one flush per 2^20 frames).
                    fw.flush(None, SEC);
                }
                set_flow(&mut f, i);
                fw.check(0, RuleDirection::Egress, black_box(&f), SEC)
            })
        });
    }
    group.bench_function("ct_parse", |b| {
        b.iter(|| qswitch_wire::ct::parse(black_box(&f)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
