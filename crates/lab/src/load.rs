//! `qswitch load` (hidden): the small TCP load generator the `affinity` and `multiqueue`
//! benchmarks run inside network namespaces.
//!
//! - `server --listen ADDR:PORT`: serves every connection in its own thread. A connection
//!   starts with a 9-byte header, a mode byte and a big-endian u64 size. Mode `r`
//!   (request/response): read `size` bytes, write `size` bytes back, until the client closes.
//!   Mode `f` (file): read `size` bytes, write one byte of acknowledgement, close.
//! - `rr --connect ADDR:PORT`: one connection, one `size`-byte request and response at a
//!   time (like `ab -c 1` or pgbench `SELECT 1`): transactions per second.
//! - `files --connect ADDR:PORT --parallel N`: N threads, each sending `size`-byte "files"
//!   one after another, a new connection per file: files per second.
//!
//! The client runs for `--seconds` and prints one JSON object: `{"per_second": [...],
//! "total": n, "seconds": s}`.
//!
//! - `relay --tap A --tap B`: creates TAPs `A` and `B` (virtio-net header, checksum and TSO
//!   offloads, as qswitch's TAP ports open them) and moves every frame read from one into
//!   the other, in one thread, until killed: no lookup, no learning, no counters. It is the
//!   `tap-relay` reference of `bench tap-tcp` and `bench affinity`: the most any userspace
//!   switch whose ports are TAPs can do on this machine, because it does nothing but the
//!   TAPs' reads and writes (each a copy through the kernel). It busy-polls for
//!   `--spin-us` after the last frame, then sleeps in epoll, like a qswitch worker.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

#[derive(clap::Subcommand, Debug)]
pub enum LoadCmd {
    /// Serve request/response and file connections.
    Server {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// One connection, request/response transactions.
    Rr {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=3600))]
        seconds: u32,
        /// Request and response size in bytes.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65536))]
        size: u64,
    },
    /// Parallel file transfers, one connection per file.
    Files {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=3600))]
        seconds: u32,
        /// File size in bytes.
        #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
        size: u64,
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
        parallel: u32,
    },
    /// Relay frames between two TAPs it creates, and nothing else (a benchmark reference).
    Relay {
        /// The two TAP interfaces (created; they disappear when the relay exits).
        #[arg(long = "tap", num_args = 1, required = true)]
        taps: Vec<String>,
        /// Pin the relay's thread to this CPU (default: the scheduler's choice).
        #[arg(long)]
        cpu: Option<usize>,
        /// Busy-poll this many microseconds after the last frame before sleeping.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
        spin_us: u64,
    },
}

pub fn run(cmd: LoadCmd) -> anyhow::Result<()> {
    match cmd {
        LoadCmd::Server { listen } => server(listen),
        LoadCmd::Rr {
            connect,
            seconds,
            size,
        } => client(seconds, 1, move |deadline, count| {
            rr(connect, size, deadline, count)
        }),
        LoadCmd::Files {
            connect,
            seconds,
            size,
            parallel,
        } => client(seconds, parallel, move |deadline, count| {
            files(connect, size, deadline, count)
        }),
        LoadCmd::Relay { taps, cpu, spin_us } => relay(&taps, cpu, Duration::from_micros(spin_us)),
    }
}

/// Frames read from one TAP per turn before the other gets its turn (qswitch's burst).
const RELAY_BURST: usize = 32;

/// See the module docs: `taps[0]` ↔ `taps[1]`, until killed.
fn relay(taps: &[String], cpu: Option<usize>, spin: Duration) -> anyhow::Result<()> {
    use qswitch_sys::epoll::{Epoll, Event};
    use qswitch_sys::tap::{
        TapOptions, TapQueue, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN,
    };
    use std::os::fd::AsRawFd;

    let [a, b] = taps else {
        bail!(
            "relay takes exactly two --tap interfaces, got {}",
            taps.len()
        );
    };
    let opts = TapOptions {
        multi_queue: false,
        vnet_hdr: true,
    };
    let open = |name: &str| -> anyhow::Result<TapQueue> {
        let q = TapQueue::open(name, opts).with_context(|| format!("cannot open TAP {name}"))?;
        q.set_offload(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN)
            .with_context(|| format!("cannot set offloads on TAP {name}"))?;
        Ok(q)
    };
    let q = [open(a)?, open(b)?];
    if let Some(c) = cpu {
        qswitch_sys::thread::pin_current_thread(c)
            .with_context(|| format!("cannot pin to CPU {c}"))?;
    }
    let ep = Epoll::new()?;
    for (i, t) in q.iter().enumerate() {
        ep.add(t.as_raw_fd(), i as u64)?;
    }
    let mut events = [Event::EMPTY; 2];
    // A virtio-net header, the largest TSO frame and room for an Ethernet header and a tag.
    let mut buf = vec![0u8; qswitch_sys::tap::VNET_HDR_LEN + 65_536 + 64];
    let mut last = Instant::now();
    loop {
        let mut moved = false;
        for i in 0..2 {
            for _ in 0..RELAY_BURST {
                match q[i].read(&mut buf) {
                    // A write the kernel refuses (the other side is down) drops the frame, as
                    // a switch would; the relay keeps going.
                    Ok(n) => {
                        moved = true;
                        let _ = q[1 - i].write(&buf[..n]);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        return Err(e).with_context(|| format!("cannot read TAP {}", q[i].name()))
                    }
                }
            }
        }
        if moved {
            last = Instant::now();
        } else if last.elapsed() >= spin {
            ep.wait(&mut events, -1)?;
            last = Instant::now();
        }
    }
}

fn server(listen: SocketAddr) -> anyhow::Result<()> {
    let l = TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    for stream in l.incoming() {
        let Ok(s) = stream else { continue };
        std::thread::spawn(move || {
            let _ = serve_one(s);
        });
    }
    Ok(())
}

fn serve_one(mut s: TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut head = [0u8; 9];
    s.read_exact(&mut head)?;
    let size = u64::from_be_bytes(head[1..].try_into().unwrap_or_default());
    let mut buf = vec![0u8; size.min(1 << 20) as usize];
    match head[0] {
        b'r' => loop {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        },
        b'f' => {
            let mut left = size;
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let n = s.read(&mut buf[..want])?;
                if n == 0 {
                    return Ok(());
                }
                left -= n as u64;
            }
            s.write_all(b"k")
        }
        _ => Ok(()),
    }
}

/// Counts per second since `t0`.
struct Counts {
    t0: Instant,
    slots: Vec<AtomicU64>,
}

impl Counts {
    fn add(&self) {
        let i = self.t0.elapsed().as_secs() as usize;
        if let Some(c) = self.slots.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn client(
    seconds: u32,
    threads: u32,
    work: impl Fn(Instant, &Counts) -> anyhow::Result<()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(u64::from(seconds));
    let counts = Arc::new(Counts {
        t0,
        slots: (0..seconds).map(|_| AtomicU64::new(0)).collect(),
    });
    let work = Arc::new(work);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (work, counts) = (work.clone(), counts.clone());
            std::thread::spawn(move || work(deadline, &counts))
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
    }
    let per_second: Vec<u64> = counts
        .slots
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    let total: u64 = per_second.iter().sum();
    println!(
        "{}",
        serde_json::json!({ "per_second": per_second, "total": total, "seconds": seconds })
    );
    Ok(())
}

fn connect(addr: SocketAddr, mode: u8, size: u64) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .with_context(|| format!("cannot connect to {addr}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = [mode; 9];
    head[1..].copy_from_slice(&size.to_be_bytes());
    s.write_all(&head)?;
    Ok(s)
}

fn rr(addr: SocketAddr, size: u64, deadline: Instant, counts: &Counts) -> anyhow::Result<()> {
    let mut s = connect(addr, b'r', size)?;
    let mut buf = vec![0u8; size as usize];
    while Instant::now() < deadline {
        s.write_all(&buf)?;
        s.read_exact(&mut buf).context("no response")?;
        counts.add();
    }
    Ok(())
}

fn files(addr: SocketAddr, size: u64, deadline: Instant, counts: &Counts) -> anyhow::Result<()> {
    let chunk = vec![0u8; size.min(1 << 16) as usize];
    while Instant::now() < deadline {
        let mut s = connect(addr, b'f', size)?;
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            s.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack).context("no acknowledgement")?;
        if ack != *b"k" {
            bail!("bad acknowledgement");
        }
        counts.add();
    }
    Ok(())
}
