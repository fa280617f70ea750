//! `qswitch placement`: where each rx queue runs, how loaded it is and why; manual pins and
//! the placement mode.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::bail;
use clap::{Args, Subcommand};
use qswitch_api::request::PlacementReport;
use qswitch_api::{PlacementMode, Request, Response};

use qswitch_api::client::call;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PlacementArgs {
    #[command(subcommand)]
    cmd: Option<PlacementCmd>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Say why each queue is where it is, the ports' CPU sets and the recent moves.
    #[arg(long)]
    explain: bool,
}

#[derive(Subcommand, Debug)]
pub enum PlacementCmd {
    /// Pin a port's rx queue to the worker on CPU; dynamic placement never moves it.
    Pin {
        port: String,
        queue: u16,
        cpu: usize,
    },
    /// Remove a pin; the queue is placed by the rules again.
    Unpin { port: String, queue: u16 },
    /// Switch between dynamic (by measured load) and static placement.
    Mode { mode: PlacementMode },
}

pub fn run(control: &Path, args: PlacementArgs) -> anyhow::Result<()> {
    let req = match args.cmd {
        Some(PlacementCmd::Pin { port, queue, cpu }) => Request::PlacementPin {
            port,
            queue,
            cpu: Some(cpu),
        },
        Some(PlacementCmd::Unpin { port, queue }) => Request::PlacementPin {
            port,
            queue,
            cpu: None,
        },
        Some(PlacementCmd::Mode { mode }) => Request::PlacementMode { mode },
        None => {
            let Response::Placement(r) = call(control, &Request::Placement)? else {
                bail!("unexpected response to a placement request");
            };
            if args.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", render(&r, args.explain));
            }
            return Ok(());
        }
    };
    call(control, &req)?;
    Ok(())
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn opt(x: Option<usize>) -> String {
    x.map_or_else(|| "-".into(), |v| v.to_string())
}

/// The human-readable report.
pub fn render(r: &PlacementReport, explain: bool) -> String {
    let mut out = String::new();
    let reserved = if r.reserved_cpus.is_empty() {
        "none".to_string()
    } else {
        r.reserved_cpus
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let _ = writeln!(out, "mode {}, reserved CPUs: {reserved}", r.mode);
    let _ = writeln!(
        out,
        "{:<7} {:>4} {:>7} {:>6}",
        "WORKER", "CPU", "BUSY", "QUEUES"
    );
    for w in &r.workers {
        let idle = if w.queues == 0 {
            "  (no queues: asleep)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{:<7} {:>4} {:>7} {:>6}{idle}",
            w.id,
            w.cpu,
            pct(w.busy),
            w.queues
        );
    }
    let width = r
        .queues
        .iter()
        .map(|q| q.port.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:<width$} {:>5} {:>4} {:>4} {:>7}  STATE",
        "PORT", "QUEUE", "CPU", "HOME", "LOAD"
    );
    for q in &r.queues {
        let _ = writeln!(
            out,
            "{:<width$} {:>5} {:>4} {:>4} {:>7}  {}",
            q.port,
            q.queue,
            opt(q.cpu),
            opt(q.home_cpu),
            pct(q.load),
            q.state
        );
        if explain {
            let _ = writeln!(out, "{:<width$}   why: {}", "", q.why);
        }
    }
    if explain {
        for s in &r.port_sets {
            let cpus: Vec<String> = s.cpus.iter().map(ToString::to_string).collect();
            let from = if s.operator { "operator" } else { "default" };
            let cpus = if cpus.is_empty() {
                "none (no rx queues)".to_string()
            } else {
                cpus.join(",")
            };
            let _ = writeln!(out, "set {}: CPUs {cpus} ({from})", s.port);
        }
        for m in &r.moves {
            let _ = writeln!(
                out,
                "moved at {} ms: {}/{} CPU {} -> {}: {}",
                m.at_ms,
                m.port,
                m.queue,
                opt(m.from_cpu),
                m.to_cpu,
                m.reason
            );
        }
    }
    for w in &r.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}
