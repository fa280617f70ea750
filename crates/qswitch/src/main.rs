//! `qswitch`: the daemon, its control CLI, the demo and the benchmarks, in one binary.
//!
//! The daemon and the CLI are the `qswitch` library (see `lib.rs`); `bench`, `demo` and the
//! hidden `load` come from `qswitch-lab`, which only those subcommands reach, and only with the
//! `lab` feature (on by default; the .deb's binary is built without it, so it has neither the
//! lab's subcommands nor its code).
//!
//! # Modules
//! - [`demo`]: `qswitch demo` — two namespaces, ping and iperf3 through a qswitch it starts.

#[cfg(feature = "lab")]
mod demo;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use qswitch::{capture, chain, cli, daemon, placement_cli, rss_cli};
#[cfg(feature = "lab")]
use qswitch_lab::{bench, load};

/// A userspace virtual switch for Linux/KVM hosts.
#[derive(Parser, Debug)]
#[command(name = "qswitch", version, about)]
struct Cli {
    /// Control socket of the daemon to talk to.
    #[arg(long, global = true, value_name = "PATH")]
    control: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the switch daemon in the foreground.
    Run {
        /// TOML configuration file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Parse and validate the configuration, then exit: 0 when valid, 2 when not.
        #[arg(long)]
        check: bool,
    },
    /// Run the self-contained demo: two namespaces, ping and iperf3 through qswitch.
    #[cfg(feature = "lab")]
    Demo {
        /// Seconds of iperf3 traffic.
        #[arg(long, default_value_t = 10)]
        seconds: u32,
        /// Parallel TCP streams.
        #[arg(long, default_value_t = 1)]
        streams: u32,
    },
    /// Show, add and remove ports.
    #[command(subcommand)]
    Port(cli::PortCmd),
    /// The firewall's tracked connections: list, flush, stats.
    #[command(subcommand)]
    Ct(qswitch::firewall_cli::CtCmd),
    /// Security groups: list, show, add, del, rules, address sets.
    #[command(subcommand)]
    Sg(qswitch::firewall_cli::SgCmd),
    /// Show the MAC learning table.
    Fdb {
        #[arg(long)]
        json: bool,
    },
    /// Show LLDP neighbours (chassis, port id, system name, port description, management
    /// address, TTL left) of every port with LLDP, or of PORT.
    Lldp {
        port: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show counters and per-second rates.
    Stats {
        #[arg(long)]
        json: bool,
        /// Print one line per second until interrupted.
        #[arg(long)]
        watch: bool,
        /// With --watch: one row per worker each second (busy %, CPU %, sleeps/s, context
        /// switches/s, queues) instead of one row for the whole switch.
        #[arg(long, requires = "watch")]
        workers: bool,
    },
    /// Port QoS: guarantees, limits and weights; allocations and rates.
    #[command(subcommand)]
    Qos(cli::QosCmd),
    /// Port mirroring sessions: `add`, `del`, `list` (docs/visibility.md).
    #[command(subcommand)]
    Mirror(cli::MirrorCmd),
    /// Bond ports: members, link and LACP state; choose the active member.
    #[command(subcommand)]
    Bond(cli::BondCmd),
    /// Toeplitz hashes and receive-side indirection tables (vRSS).
    #[command(subcommand)]
    Rss(rss_cli::RssCmd),
    /// Where each rx queue runs, its load and why; `pin`, `unpin`, `mode`.
    Placement(placement_cli::PlacementArgs),
    /// Re-read the daemon's config file and apply what changed (as SIGHUP does).
    Reload,
    /// Flow export (IPFIX, sFlow), live: `ipfix set`, `sflow set`, `off`, `show`.
    #[command(subcommand)]
    Export(cli::ExportCmd),
    /// The effective configuration.
    #[command(subcommand)]
    Config(qswitch::state::ConfigCmd),
    /// Capture a port's frames as pcapng (`-w FILE`, `-w -` for stdout) or one line each.
    Capture(capture::CaptureArgs),
    /// What the switch would do with a frame arriving on a port, and why (changes nothing).
    Trace(capture::TraceArgs),
    /// Run a benchmark scenario and write JSON + SVG results.
    #[cfg(feature = "lab")]
    Bench(bench::BenchArgs),
    /// TCP load generator the benchmarks run in namespaces (request/response, file copies).
    #[cfg(feature = "lab")]
    #[command(subcommand, hide = true)]
    Load(load::LoadCmd),
    /// Write the man page (roff) to stdout; packaging/build-deb.sh uses it.
    #[command(hide = true)]
    Man,
    /// Write a shell completion script to stdout; packaging/build-deb.sh uses it.
    #[command(hide = true)]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let control = cli
        .control
        .unwrap_or_else(|| PathBuf::from(qswitch_api::config::DEFAULT_CONTROL));
    // Not for the daemon (nor bench and demo, which run one): a panic there must be loud.
    if !runs_a_daemon(&cli.command) {
        quiet_on_closed_stdout();
    }
    let result = match cli.command {
        Command::Run {
            config,
            check: true,
        } => return check_config(&config),
        Command::Run { config, .. } => {
            init_logging();
            return daemon::run(&config);
        }
        #[cfg(feature = "lab")]
        Command::Demo { seconds, streams } => {
            init_logging();
            demo::run(seconds, streams)
        }
        Command::Port(cmd) => cli::port(&control, cmd),
        Command::Ct(cmd) => qswitch::firewall_cli::run_ct(&control, cmd),
        Command::Sg(cmd) => qswitch::firewall_cli::run_sg(&control, cmd),
        Command::Fdb { json } => cli::fdb(&control, json),
        Command::Lldp { port, json } => cli::lldp(&control, port, json),
        Command::Qos(cmd) => cli::qos(&control, cmd),
        Command::Mirror(cmd) => cli::mirror(&control, cmd),
        Command::Bond(cmd) => cli::bond(&control, cmd),
        Command::Rss(cmd) => rss_cli::run(&control, cmd),
        Command::Placement(args) => placement_cli::run(&control, args),
        Command::Stats {
            json,
            watch,
            workers,
        } => cli::stats(&control, json, watch, workers),
        Command::Reload => qswitch::reload::cli(&control),
        Command::Export(cmd) => cli::export(&control, cmd),
        Command::Config(cmd) => qswitch::state::cli(&control, cmd),
        Command::Capture(args) => capture::run(&control, args),
        Command::Trace(args) => capture::run_trace(&control, args),
        #[cfg(feature = "lab")]
        Command::Load(cmd) => load::run(cmd),
        Command::Man => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .map_err(Into::into),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "qswitch",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        #[cfg(feature = "lab")]
        Command::Bench(args) => {
            init_logging();
            bench::run(args)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if closed_stdout(&e) => ExitCode::from(CLOSED_STDOUT),
        Err(e) => {
            eprintln!("qswitch: {}", chain(&e));
            ExitCode::from(1)
        }
    }
}

/// Whether `command` runs the daemon (`run`, and `demo` and `bench`, which start one): a panic
/// there must be loud.
fn runs_a_daemon(command: &Command) -> bool {
    match command {
        Command::Run { .. } => true,
        #[cfg(feature = "lab")]
        Command::Demo { .. } | Command::Bench(_) => true,
        _ => false,
    }
}

/// The exit status of a command whose reader went away (128 + SIGPIPE, as a shell reports a
/// C tool killed by SIGPIPE).
const CLOSED_STDOUT: u8 = 141;

/// `qswitch port list | head`: when the reader of stdout goes away, end quietly with
/// [`CLOSED_STDOUT`] like C tools do, instead of a panic from `println!`.
///
/// Rust ignores SIGPIPE, so the write fails with `EPIPE` and `println!` panics. Restoring
/// SIGPIPE's default would also kill the CLI without a word when the daemon closes the
/// control socket under it; so SIGPIPE stays ignored and only this one panic is quiet.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        // `println!` says "failed printing to stdout: Broken pipe"; clap_complete's writer
        // panics with the io::Error's Debug form (`kind: BrokenPipe`).
        if msg.contains("Broken pipe") || msg.contains("BrokenPipe") {
            std::process::exit(i32::from(CLOSED_STDOUT));
        }
        default(info);
    }));
}

/// Whether `e` is a broken pipe that is not the control socket's: a write to a stdout nobody
/// reads any more (see [`quiet_on_closed_stdout`]).
fn closed_stdout(e: &anyhow::Error) -> bool {
    let daemon = e.chain().any(|c| c.is::<qswitch_api::client::CallError>());
    !daemon
        && e.chain()
            .filter_map(|c| c.downcast_ref::<std::io::Error>())
            .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// `qswitch run --config FILE --check`: what the daemon checks before it starts (parsing,
/// then CPUs, paths, names, sockets and QoS admission), without starting anything.
fn check_config(path: &std::path::Path) -> ExitCode {
    let checked = qswitch_api::config::Config::load(path).and_then(|config| {
        let online = qswitch_sys::thread::online_cpus().unwrap_or_default();
        config.validate(&online)?;
        Ok(
            qswitch::export::check(config.switch.ipfix, config.switch.sflow)
                .err()
                .map(|e| qswitch::chain(&e)),
        )
    });
    match checked {
        Ok(Some(unreachable)) => {
            eprintln!("qswitch: {unreachable}");
            ExitCode::from(2)
        }
        Ok(None) => {
            println!("{}: ok", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("qswitch: {e}");
            ExitCode::from(2)
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("QSWITCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
