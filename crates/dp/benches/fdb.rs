//! Cost of the MAC learning table on the per-burst path: `Fdb::lookup` of a known address
//! (hit) and of an unknown one (miss), and `Fdb::learn` of a known address on the same port
//! (the refresh every burst does; within `REFRESH_NS`, so no store), with 16 and 4096 entries.
//! Keys rotate through the table so one hot entry does not flatter the bigger table.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use qswitch_dp::fdb::Fdb;
use qswitch_dp::PortId;
use qswitch_wire::MacAddr;

const SEC: u64 = 1_000_000_000;

/// The `i`th locally administered unicast address, `prefix` telling sets apart.
fn mac(prefix: u8, i: usize) -> MacAddr {
    let b = (i as u32).to_be_bytes();
    MacAddr([0x02, prefix, b[0], b[1], b[2], b[3]])
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("fdb");
    for n in [16usize, 4096] {
        let fdb = Fdb::new(300 * SEC);
        let known: Vec<MacAddr> = (0..n).map(|i| mac(0, i)).collect();
        let unknown: Vec<MacAddr> = (0..n).map(|i| mac(1, i)).collect();
        for &m in &known {
            fdb.learn(m, 0, PortId(1), 0);
        }
        let mut i = 0;
        let mut next = |keys: &[MacAddr]| {
            i = (i + 1) % keys.len();
            keys[i]
        };
        group.bench_function(BenchmarkId::new("lookup_hit", n), |b| {
            b.iter(|| fdb.lookup(black_box(next(&known)), 0, SEC))
        });
        group.bench_function(BenchmarkId::new("lookup_miss", n), |b| {
            b.iter(|| fdb.lookup(black_box(next(&unknown)), 0, SEC))
        });
        group.bench_function(BenchmarkId::new("learn_refresh", n), |b| {
            b.iter(|| fdb.learn(black_box(next(&known)), 0, PortId(1), 1))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
