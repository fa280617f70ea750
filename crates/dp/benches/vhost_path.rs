//! Cost of the vhost-user data path on one core, with no switching around it: a virtio-net
//! frontend (`qswitch-virtio-driver`, what a guest does) queues a burst on port A, A's
//! `rx_burst` copies it out of "guest" memory, B's `tx_burst` writes it into B's receive
//! buffers, and B's frontend takes it back. Everything runs in this thread, so the figure is
//! the instruction and cache cost of the port code itself; a real guest on another core adds
//! the cache misses of the lines it wrote (see `qswitch bench pvp`).
//!
//! Reported per burst of 32 frames (Criterion's throughput is frames/s), 60 and 1514 bytes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qswitch_dp::packet::{Burst, BURST};
use qswitch_dp::port::vhost_user::{Mode, Reactor, VhostUserPort};
use qswitch_dp::port::Port;
use qswitch_dp::stats::DropTally;
use qswitch_virtio_driver::{Driver, DriverOptions, NetHdr};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 0xb]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xa]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f
}

fn bench(c: &mut Criterion) {
    let dir = Dir(std::env::temp_dir().join(format!("qswitch-bench-vhost-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let (sa, sb) = (dir.0.join("a.sock"), dir.0.join("b.sock"));
    let (reactor, event_loop) = Reactor::new(Default::default()).unwrap();
    std::thread::spawn(move || event_loop.run());
    let a = VhostUserPort::new("a", &sa, Mode::Server, 1, &reactor).unwrap();
    let b = VhostUserPort::new("b", &sb, Mode::Server, 1, &reactor).unwrap();
    let opts = DriverOptions {
        mem_size: 16 << 20,
        request_calls: false,
        ..DriverOptions::default()
    };
    let mut ga = Driver::connect(&sa, opts.clone()).unwrap();
    let mut gb = Driver::connect(&sb, opts).unwrap();
    let hdr_bytes = NetHdr::default().to_bytes();
    let hdr = &hdr_bytes[..ga.hdr_len()];
    let mut burst = Burst::new();
    let sel: Vec<u8> = (0..BURST as u8).collect();
    let mut drops = DropTally::default();

    let mut group = c.benchmark_group("vhost_path");
    group.throughput(Throughput::Elements(BURST as u64));
    for len in [60usize, 1514] {
        let f = frame(len);
        // One burst through, once the protocol threads have set both ports up.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            ga.send_burst(0, hdr, &f, 1).unwrap();
            let n = a.rx_burst(0, &mut burst.pkts, 0, &mut drops);
            b.tx_burst(0, &mut burst.pkts, &sel[..n], &mut drops);
            if n > 0 && gb.recv_discard(0, BURST).unwrap().0 > 0 {
                break;
            }
            assert!(Instant::now() < deadline, "ports did not come up");
            std::thread::sleep(Duration::from_millis(5));
        }
        group.bench_function(BenchmarkId::new("a_to_b", len), |bch| {
            bch.iter(|| {
                let sent = ga.send_burst(0, hdr, &f, BURST).unwrap();
                let n = a.rx_burst(0, &mut burst.pkts, 0, &mut drops);
                let done = b.tx_burst(0, &mut burst.pkts, &sel[..n], &mut drops);
                let got = gb.recv_discard(0, BURST).unwrap().0;
                debug_assert_eq!((sent, n, done.packets as u64), (BURST, BURST, got));
                got
            })
        });
    }
    group.finish();
    drop(ga);
    drop(gb);
}

criterion_group!(benches, bench);
criterion_main!(benches);
