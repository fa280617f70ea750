//! The DPDK load: `bench/dpdk-load/qsload.c`, a DPDK program with two virtio-user ports
//! (the driver DPDK guests and containers use) generating on one and sinking the other in
//! one loop on one core. A third-party load: neither qswitch's own frontend nor a peer's.
//!
//! The source is compiled into the `qswitch` binary and built on first use with the
//! machine's DPDK (`cc -O2 qsload.c $(pkg-config --cflags --libs libdpdk)`; Debian's
//! `dpdk-dev`). One run is one process: it attaches (as client of a switch's server sockets,
//! or as server for a switch that connects, like OVS's `dpdkvhostuserclient`), announces
//! both stations, sends for `warmup` s unmeasured, then `seconds` s measured, and prints one
//! JSON object.
//!
//! Two load shapes ([`POOLS`]): the generator's and the sink's buffers from one pool of 8191
//! mbufs, or from two pools of 16383 mbufs (transmit, receive), the working set of a guest
//! with more memory in flight: a switch that reads the guest's buffers pays for the larger
//! set in cache misses.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Deserialize;

use super::Bench;

const SOURCE: &str = include_str!("../../../../bench/dpdk-load/qsload.c");
/// Unmeasured seconds of traffic before the measured window.
pub const WARMUP_S: u32 = 2;
/// The load shapes every DPDK-load comparison measures: 1 = one pool of 8191 mbufs, 2 = two
/// pools of 16383 (transmit, receive).
pub const POOLS: [u32; 2] = [1, 2];
/// Seconds qsload waits for both links.
const LINK_TIMEOUT_S: u32 = 15;

/// What one qsload run printed.
#[derive(Debug, Clone, Deserialize)]
pub struct Output {
    /// The measured window, seconds.
    pub seconds: f64,
    pub sent: u64,
    pub received: u64,
    pub tx_mpps: f64,
    /// Bursts cut short because the switch's ring was full.
    pub tx_ring_full_bursts: u64,
    /// Frames received in each second of the window.
    pub per_second: Vec<u64>,
    /// Distinct flows sent, warm-up included (`--new-flows`: every frame's tuple; builds of
    /// qsload before the option printed none).
    #[serde(default)]
    pub flows_sent: u64,
}

/// Builds qsload into `dir` (once per bench run) and returns its path.
pub fn build(dir: &Path) -> anyhow::Result<PathBuf> {
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "libdpdk"])
        .output()
        .context("pkg-config (the DPDK load needs `apt-get install dpdk-dev pkg-config`)")?;
    if !flags.status.success() {
        bail!(
            "no libdpdk for pkg-config (the DPDK load needs `apt-get install dpdk-dev`, or use \
             `--load own`): {}",
            String::from_utf8_lossy(&flags.stderr).trim()
        );
    }
    std::fs::create_dir_all(dir)?;
    let src = dir.join("qsload.c");
    let bin = dir.join("qsload");
    std::fs::write(&src, SOURCE)?;
    let flags = String::from_utf8_lossy(&flags.stdout).to_string();
    let out = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .args(flags.split_whitespace())
        .output()
        .context("cc (the DPDK load is built with the C compiler)")?;
    if !out.status.success() {
        bail!(
            "building qsload failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(bin)
}

/// The two vhost-user sockets qsload attaches to.
pub struct Sockets<'a> {
    /// Port 0's, the generator's.
    pub gen: &'a Path,
    /// Port 1's, the sink's.
    pub sink: &'a Path,
    /// qsload listens (the switch connects, like OVS's `dpdkvhostuserclient`).
    pub server: bool,
}

/// The flows qsload sends (its `--flows N` or `--new-flows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Flows {
    /// qsload's default (4 UDP source ports), no option passed.
    #[default]
    Default,
    /// `--flows N`: N UDP source ports, frame after frame.
    Cycle(u32),
    /// `--new-flows`: every frame a 5-tuple not sent before in the run.
    New,
}

impl Flows {
    fn args(self) -> Vec<String> {
        match self {
            Flows::Default => Vec::new(),
            Flows::Cycle(n) => vec!["--flows".into(), n.to_string()],
            Flows::New => vec!["--new-flows".into()],
        }
    }
}

/// Runs qsload once on `cpu` on `sockets`: frames of `len` bytes, buffers from `pools`
/// (see [`POOLS`]), `flows`. `on_tick` runs about every 250 ms while it does (for CPU
/// samples). Returns what it printed.
pub fn run_flows(
    b: &Bench,
    bin: &Path,
    sockets: &Sockets<'_>,
    cpu: usize,
    (len, pools, flows): (usize, u32, Flows),
    seconds: u32,
    mut on_tick: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Output> {
    let vdev = |i: u32, path: &Path| {
        format!(
            "net_virtio_user{i},path={},queues=1{}",
            path.display(),
            if sockets.server { ",server=1" } else { "" }
        )
    };
    let prefix = format!("qsl{}x{}p{pools}", b.id, len);
    // DPDK's runtime directory goes however this ends (interrupt, timeout, error).
    let _runtime = crate::topology::RemoveDir(format!("/var/run/dpdk/{prefix}").into());
    let mut child = Command::new(bin)
        .args([
            "--no-huge",
            "-m",
            "1024",
            "--no-pci",
            "--iova-mode=va",
            "--log-level=3",
        ])
        .args(["--file-prefix", &prefix, "-l", &cpu.to_string()])
        .args([
            "--vdev",
            &vdev(0, sockets.gen),
            "--vdev",
            &vdev(1, sockets.sink),
            "--",
        ])
        .args([
            "--size",
            &len.to_string(),
            "--seconds",
            &seconds.to_string(),
            "--pools",
            &pools.to_string(),
        ])
        .args(["--warmup", &WARMUP_S.to_string()])
        .args(flows.args())
        .args(["--link-timeout", &LINK_TIMEOUT_S.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {}", bin.display()))?;
    let limit = Duration::from_secs(u64::from(seconds + WARMUP_S + LINK_TIMEOUT_S) + 20);
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if t0.elapsed() > limit || b.check().is_err() {
            let _ = child.kill();
            let _ = child.wait();
            b.check()?;
            bail!("qsload did not finish within {limit:?}");
        }
        if let Err(e) = on_tick() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .stdout
        .take()
        .map(|mut o| o.read_to_string(&mut stdout));
    child
        .stderr
        .take()
        .map(|mut e| e.read_to_string(&mut stderr));
    if !status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        bail!(
            "qsload exited with {status}: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("qsload printed no result")?;
    serde_json::from_str(line).with_context(|| format!("qsload's result: {line}"))
}
