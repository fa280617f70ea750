//! One-core load generator between two vhost-user ports of a switch.
//!
//! ```text
//! cargo run --release -p qswitch-virtio-driver --example loadgen -- \
//!     SOCK_A SOCK_B [SECONDS=5] [FRAME_LEN=60] [PAIRS=1]
//! ```
//!
//! Connects to both sockets (the switch in server mode), transmits a broadcast frame of
//! FRAME_LEN bytes (without CRC) on pair 0 of A as fast as A's tx ring allows and receives
//! on every enabled pair of B, in one loop, then prints the rates.

use std::path::Path;
use std::time::Duration;

use qswitch_virtio_driver::{poll_loop_between, Driver, DriverOptions, LoadSpec, NetHdr};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: loadgen SOCK_A SOCK_B [SECONDS=5] [FRAME_LEN=60] [PAIRS=1]");
        std::process::exit(2);
    }
    let secs: f64 = args.get(2).map_or(Ok(5.0), |s| s.parse())?;
    let len: usize = args.get(3).map_or(Ok(60), |s| s.parse())?;
    let pairs: u16 = args.get(4).map_or(Ok(1), |s| s.parse())?;
    let opts = DriverOptions {
        queue_pairs: pairs,
        request_calls: false,
        ..DriverOptions::default()
    };
    let mut a = Driver::connect(Path::new(&args[0]), opts.clone())?;
    let mut b = Driver::connect(Path::new(&args[1]), opts)?;
    eprintln!(
        "A: features {:#x}, protocol {:#x}, {} pairs max; B: features {:#x}",
        a.features(),
        a.protocol_features(),
        a.max_queue_pairs(),
        b.features()
    );

    let mut frame = vec![0u8; len.max(14)];
    frame[0..6].fill(0xff);
    frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x0a]);
    frame[12..14].copy_from_slice(&[0x88, 0xb5]);
    let hdr = NetHdr::default().to_bytes();
    let mut spec = LoadSpec::new(&hdr, &frame, Duration::from_secs_f64(secs));
    spec.drain = Duration::from_millis(200);
    let st = poll_loop_between(&mut a, &mut b, &spec)?;
    let t = st.elapsed.as_secs_f64();
    println!(
        "tx {} pkts ({:.3} Mpps), rx {} pkts ({:.3} Mpps, {:.2} Gbit/s of frames), \
         tx ring full {} times, {:.1}% lost",
        st.tx_pkts,
        st.tx_pkts as f64 / t / 1e6,
        st.rx_pkts,
        st.rx_pkts as f64 / t / 1e6,
        (st.rx_bytes - st.rx_pkts * hdr.len() as u64) as f64 * 8.0 / t / 1e9,
        st.tx_ring_full,
        100.0 * (1.0 - st.rx_pkts as f64 / st.tx_pkts.max(1) as f64)
    );
    Ok(())
}
