//! Cost of the firewall's verdict (docs/firewall.md): a packet of an established connection
//! with 1 k and 1 M connections in the table (keys visited in a scattered order, so the big
//! table is not flattered by the cache), 1 k connections active among 1 M (the table's size
//! alone, the working set that of 1 k), the same three a burst of 32 at a time as the data
//! path looks them up (`established_burst*`: [`Firewall::check_burst`]), a new connection (each frame a new flow) with one
//! rule and with 50 rules of which only the last matches, and `ct::parse` alone for
//! reference. Prints the table's memory per session once.
//!
//! `cargo bench --profile release -p qswitch-dp --bench firewall` (the release profile: the
//! bench profile's LTO would rebuild every dependency).
//!
//! For instruction counts, `QSWITCH_FW_CASE=<case> valgrind --tool=callgrind
//! --toggle-collect='*firewall::measure*' <bench binary>` runs one case without Criterion:
//! its table set up, then [`ITERS`] frames inside `measure` (the only function counted), so
//! callgrind's total over [`ITERS`] is the cost per frame. Cases: `parse`, `est_1k`,
//! `est_1m`, `est_1m_burst` (the same frames, [`BURST`] at a time through
//! [`Firewall::check_burst`]), `new_1`, `new_50`. `bench/cg_firewall.sh` runs them all.

use std::hint::black_box;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use qswitch_api::config::{Config, RuleDirection};
use qswitch_dp::firewall::{Firewall, Seen};
use qswitch_test_support::firewall::fifty_rules;
use qswitch_test_support::frames::ipv4_udp;

const SEC: u64 = 1_000_000_000;

/// A 60-byte UDP frame from the VM (10.0.0.5) to port 53; [`set_flow`] makes it flow `i`'s.
fn frame() -> Vec<u8> {
    let mut f = ipv4_udp([10, 0, 0, 5], [198, 18, 0, 0], 0, 53);
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
        // Room for n and a quarter; twice n for the 1 k table, whose 256 shards would
        // otherwise hold 13 slots each for a mean of 4 connections, and one in ~30 runs
        // a shard got 14 (refused: the fill's assert failed).
        let max = if n < 1 << 16 { 2 * n } else { n + n / 4 };
        let fw = firewall(r#"{ direction = "egress" },"#, max);
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
        if n == 1 << 20 {
            // The table's size alone: the same 1 k connections as `established/1024`
            // (spread over the 1 M: every 1024th), the other sessions in the table idle.
            let mut i = 0u32;
            group.bench_function("established_1k_of_1M", |b| {
                b.iter(|| {
                    i = i.wrapping_add(1);
                    set_flow(&mut f, scatter(i, 1 << 10) << 10);
                    fw.check(0, RuleDirection::Egress, black_box(&f), SEC)
                })
            });
        }
        // As the data path looks connections up: a burst of 32 frames at a time
        // ([`Firewall::check_burst`]: parsed and hashed first, their buckets and entries
        // prefetched, then judged), per frame.
        let mut frames = vec![f.clone(); BURST];
        let mut bursts = |name: String, active: u32, spread: u32| {
            let mut i = 0u32;
            group.throughput(Throughput::Elements(BURST as u64));
            group.bench_function(name, |b| {
                b.iter(|| burst(&fw, &mut frames, &mut i, active, spread))
            });
            group.throughput(Throughput::Elements(1));
        };
        bursts(format!("established_burst/{n}"), n, 0);
        if n == 1 << 20 {
            bursts("established_burst_1k_of_1M".into(), 1 << 10, 10);
        }
    }
    let rules50 = fifty_rules();
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

/// One burst of [`BURST`] established frames through [`Firewall::check_burst`]: the next
/// flows of the scattered walk over `active` connections (counted in `i`), each shifted by
/// `spread` bits (every `2^spread`-th connection of the table). Returns how many passed.
fn burst(fw: &Firewall, frames: &mut [Vec<u8>], i: &mut u32, active: u32, spread: u32) -> u32 {
    for g in frames.iter_mut() {
        *i = i.wrapping_add(1);
        set_flow(g, scatter(*i, active) << spread);
    }
    let mut allowed = 0u32;
    fw.check_burst(
        0,
        RuleDirection::Egress,
        frames.len(),
        |k| black_box(&frames[k]),
        |_| Seen::NONE,
        SEC,
        |_, v| allowed += u32::from(v.allowed()),
    );
    allowed
}

/// Frames a deterministic run measures.
const ITERS: u32 = 100_000;

/// Frames per call of [`Firewall::check_burst`] in the burst cases (the engine's burst).
const BURST: usize = 32;

/// The counted part of a deterministic run: `ITERS` frames of the case.
#[inline(never)]
fn measure(case: &str, fw: &Firewall, n: u32, f: &mut [u8]) -> u32 {
    let mut allowed = 0u32;
    match case {
        "parse" => {
            for _ in 0..ITERS {
                allowed += u32::from(qswitch_wire::ct::parse(black_box(&*f)).is_ok());
            }
        }
        "est_1m_burst" => {
            let mut frames = vec![f.to_vec(); BURST];
            let mut i = 0u32;
            for _ in 0..ITERS / BURST as u32 {
                allowed += burst(fw, &mut frames, &mut i, n, 0);
            }
        }
        _ => {
            let new = case.starts_with("new");
            for i in 0..ITERS {
                set_flow(f, if new { i } else { scatter(i, n) });
                allowed += u32::from(
                    fw.check(0, RuleDirection::Egress, black_box(&*f), SEC)
                        .allowed(),
                );
            }
        }
    }
    allowed
}

/// A deterministic run of one case (see the module's doc).
fn deterministic(case: &str) {
    let mut f = frame();
    let (rules, n, max) = match case {
        "est_1k" => (r#"{ direction = "egress" },"#.to_string(), 1 << 10, 1 << 11),
        "est_1m" | "est_1m_burst" => (
            r#"{ direction = "egress" },"#.to_string(),
            1 << 20,
            (1 << 20) + (1 << 18),
        ),
        "new_50" => (fifty_rules(), 0, 1 << 20),
        _ => (r#"{ direction = "egress" },"#.to_string(), 0, 1 << 20),
    };
    let fw = firewall(&rules, max);
    for i in 0..n {
        set_flow(&mut f, i);
        assert!(fw.check(0, RuleDirection::Egress, &f, SEC).allowed());
    }
    let allowed = measure(case, &fw, n.max(1), &mut f);
    eprintln!("{case}: {ITERS} frames, {allowed} allowed");
}

criterion_group!(benches, bench);

fn main() {
    if let Ok(case) = std::env::var("QSWITCH_FW_CASE") {
        deterministic(&case);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
