//! `soak` (issue 15 point 7; a bench, not a CI test): `--seconds` (default here: 600) of
//! load through an in-process switch while ports come and go, watching for leaks.
//!
//! - Load, VLAN 10: a gen port sending 64-byte frames at 200 kpps to a gen sink.
//! - Load, VLAN 20: two vhost-user ports driven by the in-process virtio frontend
//!   (`qswitch-virtio-driver`), a → b, b having announced its MAC.
//! - Churn, VLAN 30, every 2 s: a TAP port and a frontend-less vhost-user port are added,
//!   a gen port is added and removed, a QoS limit is set and cleared, the previous round's
//!   ports are removed; every 10 s the vhost-user frontend b reconnects.
//!
//! Every second it records the process's VmRSS and open fd count. At the end it checks
//! counters of the load VLANs: frames in = frames out + counted drops (within what may be in
//! flight). Writes `out/soak.json`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use qswitch_api::{GenConfig, GenPortConfig, PortConfig, PortKind, VhostMode};
use qswitch_dp::{Options, Switch};
use qswitch_virtio_driver::{Driver, DriverOptions, NetHdr};

use super::{Bench, RemoveDir};

const MAC_GEN_SRC: &str = "02:00:00:10:00:01";
const MAC_GEN_SINK: &str = "02:00:00:10:00:02";
const MAC_A: [u8; 6] = [2, 0, 0, 0x20, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0, 0x20, 0, 2];

fn proc_status(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

fn with_vlan(mut p: PortConfig, vlan: u16) -> PortConfig {
    p.vlan = Some(vlan.try_into().expect("vlan"));
    p
}

fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f
}

fn connect(sock: &std::path::Path) -> anyhow::Result<Driver> {
    Driver::connect(
        sock,
        DriverOptions {
            mem_size: 8 << 20,
            ..DriverOptions::default()
        },
    )
    .map_err(|e| anyhow::anyhow!("connect {}: {e}", sock.display()))
}

#[derive(serde::Serialize)]
struct Sample {
    t_s: f64,
    rss_kib: u64,
    fds: u64,
}

#[derive(serde::Serialize)]
struct PortTotals {
    name: String,
    rx: u64,
    tx: u64,
    drops: u64,
}

pub fn run(b: &Bench) -> anyhow::Result<()> {
    let seconds = u64::from(b.args.seconds);
    let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-soak-{}", b.id)));
    std::fs::create_dir_all(&dir.0)?;
    let cpus = crate::topology::worker_cpus(1)?;
    let cpu: usize = cpus
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap_or("0")
        .parse()
        .context("worker cpu")?;
    let sw = Switch::start(&[cpu], &Options::default())?;
    sw.add_port(&with_vlan(
        PortConfig::new(
            "sink",
            PortKind::Gen(GenPortConfig {
                mac: Some(MAC_GEN_SINK.parse()?),
                generate: None,
            }),
        ),
        10,
    ))?;
    sw.add_port(&with_vlan(
        PortConfig::new(
            "src",
            PortKind::Gen(GenPortConfig {
                mac: Some(MAC_GEN_SRC.parse()?),
                generate: Some(GenConfig {
                    dst: MAC_GEN_SINK.parse()?,
                    size: 64,
                    rate: 200_000,
                    flows: 16,
                    count: 0,
                    ip: None,
                }),
            }),
        ),
        10,
    ))?;
    let sock = |n: &str| -> PathBuf { dir.0.join(format!("{n}.sock")) };
    for n in ["va", "vb"] {
        let p = PortConfig::vhost_user(n, sock(n).as_path().try_into()?, VhostMode::Server);
        sw.add_port(&with_vlan(p, 20))?;
    }
    let mut a = connect(&sock("va"))?;
    let mut vb = Some(connect(&sock("vb"))?);
    let hdr = NetHdr::default().to_bytes()[..a.hdr_len()].to_vec();
    let announce = |d: &mut Driver| -> anyhow::Result<()> {
        let h = NetHdr::default().to_bytes()[..d.hdr_len()].to_vec();
        d.send(0, &h, &frame([0xff; 6], MAC_B))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    };
    announce(vb.as_mut().expect("b"))?;
    std::thread::sleep(Duration::from_millis(100));
    let a_to_b = frame(MAC_B, MAC_A);

    b.say(format_args!(
        "soak for {seconds} s: gen 200 kpps (VLAN 10), vhost-user a->b (VLAN 20), port churn \
         every 2 s (VLAN 30), worker on CPU {cpu}"
    ));
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut next_sample = Duration::ZERO;
    let mut next_churn = Duration::from_secs(2);
    let mut round = 0u32;
    let mut churn_errors = 0u32;
    let mut sent_a = 0u64;
    let mut buf = Vec::new();
    while start.elapsed() < Duration::from_secs(seconds) {
        b.check()?;
        // vhost-user load: keep a's tx ring busy; b drains its rx ring.
        sent_a += a
            .send_burst(0, &hdr, &a_to_b, 64)
            .map_err(|e| anyhow::anyhow!("{e}"))? as u64;
        if let Some(d) = vb.as_mut() {
            while d
                .recv(0, &mut buf)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .is_some()
            {}
        }
        let now = start.elapsed();
        if now >= next_sample {
            samples.push(Sample {
                t_s: now.as_secs_f64(),
                rss_kib: proc_status("VmRSS:"),
                fds: open_fds(),
            });
            next_sample += Duration::from_secs(1);
        }
        if now >= next_churn {
            next_churn += Duration::from_secs(2);
            round += 1;
            let prev = round - 1;
            let mut ok = true;
            for n in [format!("t{prev}"), format!("v{prev}")] {
                if prev > 0 {
                    ok &= sw.del_port(&n).is_ok();
                }
            }
            let tap = PortConfig::tap(
                &format!("t{round}"),
                format!("qssoak{}", round % 1000).parse()?,
            );
            ok &= sw.add_port(&with_vlan(tap, 30)).is_ok();
            let v = PortConfig::vhost_user(
                &format!("v{round}"),
                sock(&format!("v{round}")).as_path().try_into()?,
                VhostMode::Server,
            );
            ok &= sw.add_port(&with_vlan(v, 30)).is_ok();
            ok &= sw.add_port(&with_vlan(PortConfig::gen("g"), 30)).is_ok();
            ok &= sw.del_port("g").is_ok();
            if !ok {
                churn_errors += 1;
            }
            if round.is_multiple_of(5) {
                // b goes away and comes back (frames to it meanwhile: counted no_queue drops).
                if let Some(d) = vb.take() {
                    d.close();
                }
                std::thread::sleep(Duration::from_millis(20));
                let mut d = connect(&sock("vb"))?;
                announce(&mut d)?;
                vb = Some(d);
            }
            let last = samples.last().map_or((0, 0), |s| (s.rss_kib, s.fds));
            b.say(format_args!(
                "round {round}: RSS {} KiB, {} fds, churn errors {churn_errors}",
                last.0, last.1
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // Let in-flight frames land, then read the counters.
    std::thread::sleep(Duration::from_millis(300));
    if let Some(d) = vb.as_mut() {
        while d
            .recv(0, &mut buf)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .is_some()
        {}
    }
    let stats = sw.stats();
    let totals: Vec<PortTotals> = stats
        .ports
        .iter()
        .filter(|p| ["src", "sink", "va", "vb"].contains(&p.name.as_str()))
        .map(|p| PortTotals {
            name: p.name.clone(),
            rx: p.rx_packets,
            tx: p.tx_packets,
            drops: p.drops.values().sum(),
        })
        .collect();
    let sum = |f: fn(&PortTotals) -> u64| totals.iter().map(f).sum::<u64>();
    let (rx, tx, drops) = (sum(|p| p.rx), sum(|p| p.tx), sum(|p| p.drops));
    // A gen source keeps generating while the counters are read: allow one second of it.
    let slack = 200_000 + 4096;
    let consistent = rx.abs_diff(tx + drops) <= slack;
    let warm = samples.iter().find(|s| s.t_s >= 10.0).or(samples.first());
    let (first, last) = (
        warm.map_or(0, |s| s.rss_kib),
        samples.last().map_or(0, |s| s.rss_kib),
    );
    let (fds0, fds1) = (
        warm.map_or(0, |s| s.fds),
        samples.last().map_or(0, |s| s.fds),
    );
    b.say(format_args!(
        "frames in {rx}, out {tx}, dropped {drops} (in - out - drops = {}), consistent: \
         {consistent}; RSS after warm-up {first} -> {last} KiB; fds {fds0} -> {fds1}; \
         {round} churn rounds, {churn_errors} with errors; a sent {sent_a}",
        rx as i128 - tx as i128 - drops as i128
    ));
    let report = serde_json::json!({
        "scenario": "soak",
        "seconds": seconds,
        "worker_cpu": cpu,
        "churn_rounds": round,
        "churn_errors": churn_errors,
        "frames": { "in": rx, "out": tx, "dropped": drops, "consistent": consistent, "slack": slack },
        "ports": totals,
        "rss_kib": { "after_warmup": first, "end": last },
        "fds": { "after_warmup": fds0, "end": fds1 },
        "samples": samples,
    });
    a.close();
    if let Some(d) = vb {
        d.close();
    }
    sw.shutdown();
    let svg = crate::plot::line_chart(
        "soak: resident memory and open fds",
        "s",
        "KiB / fds",
        &[
            crate::plot::Series {
                name: "VmRSS KiB".into(),
                points: samples.iter().map(|s| (s.t_s, s.rss_kib as f64)).collect(),
            },
            crate::plot::Series {
                name: "fds x100".into(),
                points: samples
                    .iter()
                    .map(|s| (s.t_s, s.fds as f64 * 100.0))
                    .collect(),
            },
        ],
        &[],
    );
    super::write_results(&b.args.out, "soak", &report, &svg)
}
