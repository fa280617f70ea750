//! `qswitch capture` and `qswitch trace`: both ends.
//!
//! Capture is the control protocol's one streaming request: the daemon attaches a tap to the
//! port ([`qswitch_dp::capture`]), then drains its ring every 10 ms and sends the frames as
//! [`Response::CapturePackets`] lines (an empty one at least every second, with the
//! capture's counters), until `-c N` frames were sent, the port is removed, or the client
//! closes the connection; dropping the tap detaches it, so the data path is back to one
//! flag check per burst. Bounded (issue 27 F8): at most [`MAX_CAPTURES`] run at once (more
//! are refused), a line carries at most [`LINE_BYTES`] of frame data, and a client that
//! takes nothing for [`STALL`], or whose port goes while it is not reading, is cut off. The CLI writes pcapng (`qswitch_wire::pcapng`) to a file or
//! stdout, or prints one line per frame.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Args;
use qswitch_api::request::{CaptureDirection, CaptureRequest, CapturedPacket, TraceReport};
use qswitch_api::{Request, Response};
use qswitch_dp::capture::{Direction, Filter, Spec, MAX_SNAPLEN};
use qswitch_wire::pcapng;
use qswitch_wire::MacAddr;

use crate::daemon::Daemon;

/// Most records sent in one line.
const LINE_RECORDS: usize = 512;
/// Most bytes of frame data in one line (its JSON is about twice this: hex).
const LINE_BYTES: usize = 1 << 20;
/// How often the daemon drains the ring (and checks the client is still there).
const DRAIN_EVERY: Duration = Duration::from_millis(10);
/// Most captures running at once; more are refused (each holds up to
/// 2 × [`qswitch_dp::capture::RING_BYTES`] and a thread).
pub const MAX_CAPTURES: usize = 8;
/// A client that takes nothing of its capture for this long is cut off (its capture ends).
pub const STALL: Duration = Duration::from_secs(10);

/// The captures running, at most [`MAX_CAPTURES`].
#[derive(Debug, Default)]
pub struct Running(AtomicUsize);

/// One capture's place in [`Running`]; dropping it frees the place.
struct Place<'a>(&'a AtomicUsize);

impl Running {
    fn claim(&self) -> Option<Place<'_>> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_CAPTURES).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(&self.0))
    }

    /// Captures running now.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

// ---------------------------------------------------------------------------------------
// Daemon side.

fn spec_of(req: &CaptureRequest) -> anyhow::Result<Spec> {
    let snaplen = req.snaplen as usize;
    if snaplen == 0 || snaplen > MAX_SNAPLEN {
        bail!("snaplen must be 1..={MAX_SNAPLEN}");
    }
    let mac = req
        .mac
        .as_deref()
        .map(|m| {
            m.parse::<MacAddr>()
                .with_context(|| format!("bad MAC '{m}'"))
        })
        .transpose()?;
    Ok(Spec {
        queue: req.queue,
        rx: req.direction != CaptureDirection::Tx,
        tx: req.direction != CaptureDirection::Rx,
        snaplen,
        slots: None,
        filter: Filter {
            ether_type: req.ether_type,
            mac,
            vlan: req.vlan,
        },
    })
}

fn send(stream: &UnixStream, r: &Response) -> io::Result<()> {
    let mut out = serde_json::to_vec(r).unwrap_or_default();
    out.push(b'\n');
    (&*stream).write_all(&out)
}

/// How long one blocked write waits before [`send_live`] looks again.
const WRITE_SLICE: Duration = Duration::from_secs(1);

/// [`send`] for a running capture (the stream's write timeout is [`WRITE_SLICE`]): gives up
/// when `gone()` says the capture has no reason to go on (its port went) or the client has
/// taken nothing for [`STALL`], so a client that stops reading holds no thread, ring or port.
fn send_live(stream: &UnixStream, r: &Response, gone: impl Fn() -> bool) -> io::Result<()> {
    let mut out = serde_json::to_vec(r).unwrap_or_default();
    out.push(b'\n');
    let (mut done, mut progress) = (0, Instant::now());
    while done < out.len() {
        match (&*stream).write(&out[done..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                done += n;
                progress = Instant::now();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if gone() {
                    return Err(io::Error::other(
                        "the port went while the client was not reading",
                    ));
                }
                if progress.elapsed() >= STALL {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading its capture",
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Serves one capture request on `stream` until the count is reached, the port goes, the
/// client disconnects or stops taking what is sent for [`STALL`]. Refused when
/// [`MAX_CAPTURES`] run already.
pub fn serve(stream: &UnixStream, daemon: &Daemon, req: CaptureRequest) -> io::Result<()> {
    let sw = &daemon.switch;
    stream.set_write_timeout(Some(WRITE_SLICE))?;
    let Some(_place) = daemon.captures.claim() else {
        return send(
            stream,
            &Response::Error {
                message: format!(
                    "too many captures running ({MAX_CAPTURES} at most); try again when one ends"
                ),
            },
        );
    };
    let cap = match spec_of(&req)
        .and_then(|spec| sw.capture(&req.port, spec).map_err(anyhow::Error::from))
    {
        Ok(c) => c,
        Err(e) => {
            return send(
                stream,
                &Response::Error {
                    message: crate::chain(&e),
                },
            )
        }
    };
    tracing::info!(port = %req.port, "capture started");
    // Switch clock -> Unix time.
    let offset = unix_ns().saturating_sub(sw.now());
    send(
        stream,
        &Response::CaptureStarted {
            port: req.port.clone(),
            snaplen: req.snaplen,
            slots: cap
                .tap()
                .spec()
                .slots
                .unwrap_or_else(|| qswitch_dp::capture::ring_slots(cap.tap().spec().snaplen)),
            ring_bytes: cap.tap().ring_bytes(),
        },
    )?;
    stream.set_read_timeout(Some(DRAIN_EVERY))?;
    let mut sent = 0u64;
    let mut beat = Instant::now();
    let mut recs = Vec::with_capacity(LINE_RECORDS);
    let mut scratch = [0u8; 256];
    let reason = loop {
        // Waits up to DRAIN_EVERY; end of file means the client went away.
        match (&*stream).read(&mut scratch) {
            Ok(0) => break "client closed",
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
        let room = req.count.map_or(LINE_RECORDS as u64, |c| c - sent) as usize;
        recs.clear();
        cap.drain_within(&mut recs, room.min(LINE_RECORDS), LINE_BYTES);
        if !recs.is_empty() || beat.elapsed() >= Duration::from_secs(1) {
            let packets = recs
                .iter()
                .map(|r| CapturedPacket {
                    ts_ns: offset.saturating_add(r.ts),
                    dir: match r.dir {
                        Direction::Rx => "rx",
                        Direction::Tx => "tx",
                    }
                    .into(),
                    queue: r.queue,
                    orig_len: r.orig_len,
                    data: hex(&r.data),
                })
                .collect();
            sent += recs.len() as u64;
            send_live(
                stream,
                &Response::CapturePackets {
                    packets,
                    captured: cap.tap().captured(),
                    dropped: cap.tap().dropped(),
                },
                || cap.port_gone() || sw.stopping(),
            )?;
            beat = Instant::now();
        }
        if req.count.is_some_and(|c| sent >= c) {
            break "count reached";
        }
        if cap.port_gone() {
            break "port removed";
        }
        if sw.stopping() {
            break "switch stopping";
        }
    };
    tracing::info!(port = %req.port, sent, dropped = cap.tap().dropped(), reason, "capture ended");
    let end = Response::CaptureEnd {
        captured: cap.tap().captured(),
        dropped: cap.tap().dropped(),
        reason: reason.into(),
    };
    drop(cap);
    send(stream, &end)
}

fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(D[usize::from(x >> 4)] as char);
        s.push(D[usize::from(x & 15)] as char);
    }
    s
}

/// Hex to bytes; spaces, colons and a leading "0x" are ignored.
pub fn unhex(s: &str) -> anyhow::Result<Vec<u8>> {
    let s = s.trim().trim_start_matches("0x");
    let digits: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b':')
        .collect();
    if !digits.len().is_multiple_of(2) {
        bail!("odd number of hex digits");
    }
    digits
        .chunks(2)
        .map(|p| {
            let d = |c: u8| (c as char).to_digit(16).map(|v| v as u8);
            match (d(p[0]), d(p[1])) {
                (Some(h), Some(l)) => Ok(h << 4 | l),
                _ => bail!("not hex: '{}{}'", p[0] as char, p[1] as char),
            }
        })
        .collect()
}

/// Carries out a trace request.
pub fn trace(daemon: &Daemon, port: &str, frame: &str) -> Response {
    let result = unhex(frame)
        .context("bad frame")
        .and_then(|f| daemon.switch.trace(port, &f).map_err(anyhow::Error::from));
    match result {
        Ok(t) => Response::Trace(Box::new(t)),
        Err(e) => Response::Error {
            message: crate::chain(&e),
        },
    }
}

// ---------------------------------------------------------------------------------------
// CLI side.

/// `qswitch capture PORT ...`
#[derive(Args, Debug)]
pub struct CaptureArgs {
    /// The port to capture on.
    pub port: String,
    /// Only this rx queue (sent frames are captured whatever the queue).
    #[arg(long)]
    pub queue: Option<u16>,
    /// Received by the switch from the port (rx), sent to it (tx), or both.
    #[arg(long, default_value = "both", value_parser = parse_direction)]
    pub direction: CaptureDirection,
    /// Stop after N frames.
    #[arg(short = 'c', long = "count", value_name = "N")]
    pub count: Option<u64>,
    /// Write pcapng to FILE ("-": stdout) instead of one line per frame.
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    pub write: Option<PathBuf>,
    /// Bytes kept of each frame.
    #[arg(long, default_value_t = MAX_SNAPLEN as u32)]
    pub snaplen: u32,
    /// Filter: EtherType (0x0806, 2054, or arp / ipv4 / ipv6 / vlan); matches the outer
    /// type or the one after a single 802.1Q tag.
    #[arg(long, value_parser = parse_ether_type)]
    pub ether_type: Option<u16>,
    /// Filter: source or destination MAC.
    #[arg(long)]
    pub mac: Option<MacAddr>,
    /// Filter: 802.1Q VLAN id (tagged frames only).
    #[arg(long)]
    pub vlan: Option<u16>,
}

fn parse_direction(s: &str) -> Result<CaptureDirection, String> {
    match s {
        "rx" | "in" => Ok(CaptureDirection::Rx),
        "tx" | "out" => Ok(CaptureDirection::Tx),
        "both" => Ok(CaptureDirection::Both),
        _ => Err("expected rx, tx or both".into()),
    }
}

fn parse_ether_type(s: &str) -> Result<u16, String> {
    match s.to_ascii_lowercase().as_str() {
        "arp" => Ok(0x0806),
        "ipv4" | "ip" => Ok(0x0800),
        "ipv6" | "ip6" => Ok(0x86dd),
        "vlan" => Ok(0x8100),
        x => match x.strip_prefix("0x") {
            Some(h) => u16::from_str_radix(h, 16),
            None => x.parse(),
        }
        .map_err(|e| format!("bad EtherType '{s}': {e}")),
    }
}

enum Sink {
    Pcap(pcapng::Writer<Box<dyn Write>>, pcapng::InterfaceId),
    Text(io::Stdout),
}

/// Runs `qswitch capture`.
pub fn run(control: &Path, a: CaptureArgs) -> anyhow::Result<()> {
    let req = Request::Capture(CaptureRequest {
        port: a.port.clone(),
        queue: a.queue,
        direction: a.direction,
        count: a.count,
        snaplen: a.snaplen,
        ether_type: a.ether_type,
        mac: a.mac.map(|m| m.to_string()),
        vlan: a.vlan,
    });
    let stream = UnixStream::connect(control)
        .with_context(|| format!("cannot connect to {}", control.display()))?;
    let mut line = serde_json::to_vec(&req)?;
    line.push(b'\n');
    (&stream).write_all(&line)?;
    let mut reader = BufReader::new(&stream);
    let mut next = || -> anyhow::Result<Option<Response>> {
        let mut l = String::new();
        if reader.read_line(&mut l)? == 0 {
            return Ok(None);
        }
        match serde_json::from_str::<Response>(&l).context("unreadable reply")? {
            Response::Error { message } => bail!("{message}"),
            r => Ok(Some(r)),
        }
    };
    let Some(Response::CaptureStarted { slots, .. }) = next()? else {
        bail!("unexpected reply");
    };
    let mut sink = match &a.write {
        Some(p) => {
            let out: Box<dyn Write> = if p.as_os_str() == "-" {
                Box::new(io::BufWriter::new(io::stdout()))
            } else {
                Box::new(io::BufWriter::new(
                    std::fs::File::create(p)
                        .with_context(|| format!("cannot create {}", p.display()))?,
                ))
            };
            let mut w = pcapng::Writer::new(out, a.snaplen)?;
            let id = w.add_interface(&a.port)?;
            w.flush()?;
            Sink::Pcap(w, id)
        }
        None => Sink::Text(io::stdout()),
    };
    eprintln!(
        "qswitch: capturing on {} ({} slots of {} bytes)",
        a.port, slots, a.snaplen
    );
    let mut written = 0u64;
    let (mut captured, mut dropped) = (0u64, 0u64);
    let mut reason = "daemon closed the connection".to_string();
    while let Some(r) = next()? {
        match r {
            Response::CapturePackets {
                packets,
                captured: c,
                dropped: d,
            } => {
                (captured, dropped) = (c, d);
                for p in packets {
                    if a.count.is_some_and(|n| written >= n) {
                        break;
                    }
                    let data = unhex(&p.data)?;
                    let dir = if p.dir == "rx" {
                        pcapng::Direction::Inbound
                    } else {
                        pcapng::Direction::Outbound
                    };
                    let res = match &mut sink {
                        Sink::Pcap(w, id) => {
                            w.write_packet_truncated(*id, p.ts_ns, dir, &data, p.orig_len as usize)
                        }
                        Sink::Text(out) => writeln!(out, "{}", summary(&p, &data)),
                    };
                    if let Err(e) = res {
                        // A reader that went away (`| head`) ends the capture quietly.
                        if e.kind() == io::ErrorKind::BrokenPipe {
                            return Ok(());
                        }
                        return Err(e.into());
                    }
                    written += 1;
                }
                let res = match &mut sink {
                    Sink::Pcap(w, _) => w.flush(),
                    Sink::Text(out) => out.flush(),
                };
                if let Err(e) = res {
                    if e.kind() == io::ErrorKind::BrokenPipe {
                        return Ok(());
                    }
                    return Err(e.into());
                }
            }
            Response::CaptureEnd {
                captured: c,
                dropped: d,
                reason: why,
            } => {
                (captured, dropped, reason) = (c, d, why);
                break;
            }
            _ => bail!("unexpected reply"),
        }
    }
    if let Sink::Pcap(w, _) = &mut sink {
        w.flush()?;
    }
    eprintln!(
        "qswitch: {written} frames written; the capture took {captured} and dropped {dropped} in its ring ({reason})"
    );
    Ok(())
}

fn summary(p: &CapturedPacket, f: &[u8]) -> String {
    let secs = p.ts_ns / 1_000_000_000;
    let mac = |b: &[u8]| MacAddr(b.try_into().unwrap_or([0; 6])).to_string();
    let (dst, src, et) = if f.len() >= 14 {
        (
            mac(&f[0..6]),
            mac(&f[6..12]),
            format!("{:#06x}", u16::from_be_bytes([f[12], f[13]])),
        )
    } else {
        ("?".into(), "?".into(), "?".into())
    };
    format!(
        "{:02}:{:02}:{:02}.{:09} {} q{} {src} > {dst} ethertype {et} length {}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60,
        p.ts_ns % 1_000_000_000,
        p.dir,
        p.queue,
        p.orig_len
    )
}

/// `qswitch trace ...`
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// Ingress port.
    #[arg(long)]
    pub port: String,
    /// The whole frame, hex (spaces and colons ignored).
    #[arg(long, conflicts_with_all = ["src", "dst"])]
    pub frame: Option<String>,
    /// Source MAC (builds the frame from flow fields).
    #[arg(long, requires = "dst")]
    pub src: Option<MacAddr>,
    /// Destination MAC.
    #[arg(long, requires = "src")]
    pub dst: Option<MacAddr>,
    /// Adds an 802.1Q tag with this VLAN id.
    #[arg(long)]
    pub vlan: Option<u16>,
    /// IPv4 source and destination (an IPv4 packet; else EtherType 0x88b5, 64 bytes).
    #[arg(long, num_args = 2, value_names = ["SRC", "DST"])]
    pub ip: Option<Vec<std::net::Ipv4Addr>>,
    /// tcp or udp (with --ip).
    #[arg(long, default_value = "udp")]
    pub proto: String,
    #[arg(long, default_value_t = 1024)]
    pub sport: u16,
    #[arg(long, default_value_t = 80)]
    pub dport: u16,
    #[arg(long)]
    pub json: bool,
}

/// Builds the frame a trace's flow fields describe.
pub fn build_frame(a: &TraceArgs) -> anyhow::Result<Vec<u8>> {
    if let Some(f) = &a.frame {
        return unhex(f);
    }
    let (Some(src), Some(dst)) = (a.src, a.dst) else {
        bail!("give --frame HEX or --src MAC --dst MAC");
    };
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    if let Some(v) = a.vlan {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&(v & 0x0fff).to_be_bytes());
    }
    match &a.ip {
        Some(ips) => {
            let proto: u8 = match a.proto.as_str() {
                "udp" => 17,
                "tcp" => 6,
                p => bail!("--proto must be tcp or udp, not '{p}'"),
            };
            let l4_len = if proto == 6 { 20 } else { 8 };
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + l4_len) as u16).to_be_bytes());
            ip[8] = 64;
            ip[9] = proto;
            ip[12..16].copy_from_slice(&ips[0].octets());
            ip[16..20].copy_from_slice(&ips[1].octets());
            let csum = qswitch_wire::checksum::fold(qswitch_wire::checksum::sum16(&ip, 0));
            ip[10..12].copy_from_slice(&csum.to_be_bytes());
            f.extend_from_slice(&ip);
            let mut l4 = vec![0u8; l4_len];
            l4[0..2].copy_from_slice(&a.sport.to_be_bytes());
            l4[2..4].copy_from_slice(&a.dport.to_be_bytes());
            if proto == 17 {
                l4[4..6].copy_from_slice(&8u16.to_be_bytes());
            } else {
                l4[12] = 5 << 4;
            }
            f.extend_from_slice(&l4);
        }
        None => f.extend_from_slice(&0x88b5u16.to_be_bytes()),
    }
    if f.len() < 60 {
        f.resize(60, 0);
    }
    Ok(f)
}

/// Runs `qswitch trace`.
pub fn run_trace(control: &Path, a: TraceArgs) -> anyhow::Result<()> {
    let frame = build_frame(&a)?;
    let req = Request::Trace {
        port: a.port.clone(),
        frame: hex(&frame),
    };
    let Response::Trace(t) = qswitch_api::client::call(control, &req)? else {
        bail!("unexpected reply");
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&t)?);
    } else {
        print!("{}", render(&t));
    }
    Ok(())
}

/// A trace as text: the steps, then the verdict.
pub fn render(t: &TraceReport) -> String {
    let mut s = String::new();
    for (i, step) in t.steps.iter().enumerate() {
        s.push_str(&format!("{:>2}. {step}\n", i + 1));
    }
    let outs: Vec<String> = t
        .egress
        .iter()
        .map(|e| match e.tagged {
            Some(v) => format!("{} (tagged {v})", e.port),
            None => e.port.clone(),
        })
        .collect();
    s.push_str(&match t.verdict.as_str() {
        "drop" => format!(
            "verdict: drop ({})\n",
            t.drop_reason.as_deref().unwrap_or("?")
        ),
        v => format!("verdict: {v} -> {}\n", outs.join(", ")),
    });
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&b), "0001abff");
        assert_eq!(unhex("00 01:AB ff").unwrap(), b);
        assert!(unhex("abc").is_err());
        assert!(unhex("zz").is_err());
    }

    #[test]
    fn flow_fields_build_a_frame() {
        let a = TraceArgs {
            port: "p".into(),
            frame: None,
            src: Some("02:00:00:00:00:01".parse().unwrap()),
            dst: Some("02:00:00:00:00:02".parse().unwrap()),
            vlan: None,
            ip: Some(vec![
                "10.0.0.1".parse().unwrap(),
                "10.0.0.2".parse().unwrap(),
            ]),
            proto: "udp".into(),
            sport: 5000,
            dport: 53,
            json: false,
        };
        let f = build_frame(&a).unwrap();
        let key = qswitch_wire::flow::extract(&f).expect("an IPv4/UDP flow");
        assert_eq!(key.proto, 17);
        assert_eq!(key.ports, Some((5000, 53)));
    }
}
