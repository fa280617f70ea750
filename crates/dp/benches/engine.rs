//! Cost of the forwarding engine on one core, with test-double ports around it: bursts of 32
//! frames injected on port `a` of a manual switch ([`Switch::manual`], no threads) and
//! switched to port `b` (known unicast) or flooded to `b` and `c` (broadcast). The inject
//! ports copy frames in and out (an allocation each), so for the engine alone take the
//! instructions of `Forwarder::poll` less its ports' `rx_burst` and `tx_burst`
//! (`bench/cg_engine.py` does, from a callgrind profile of this bench).
//!
//! Reported per burst of 32 frames (Criterion's throughput is frames/s).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qswitch_dp::packet::BURST;
use qswitch_dp::{Options, Switch};

fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
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
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
