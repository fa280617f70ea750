//! `qswitch rss`: the Toeplitz hash as the data path computes it, and a port's indirection
//! table (vRSS).

use std::net::IpAddr;
use std::path::Path;

use anyhow::{bail, Context};
use clap::Subcommand;
use qswitch_api::{Request, Response};
use qswitch_dp::rss::{Reta, Toeplitz};
use qswitch_wire::flow::{FlowKey, IpPair};

use qswitch_api::client::call;

#[derive(Subcommand, Debug)]
pub enum RssCmd {
    /// Print the 32-bit Toeplitz hash (8 hex digits) of raw input bytes or of a flow.
    Hash {
        /// Key as hex: at least 40 bytes, and at least 4 more than the input (the hash of n
        /// bytes uses the key's first n + 4); Microsoft's 40-byte key when absent.
        #[arg(long)]
        key: Option<String>,
        /// Raw input bytes as hex.
        #[arg(long, conflicts_with = "flow")]
        input: Option<String>,
        /// A flow: SRC:SPORT-DST:DPORT/tcp|udp, or SRC-DST/ip for addresses only; IPv6
        /// addresses in brackets, e.g. [fe80::1]:80-[fe80::2]:81/tcp.
        #[arg(long)]
        flow: Option<String>,
        /// Hash both directions of the flow the same (not Microsoft's hash).
        #[arg(long)]
        symmetric: bool,
    },
    /// Print a port's indirection table (which receive queue each hash bucket goes to).
    Show { port: String },
    /// Tell which receive queue of a port a flow lands on.
    Queue {
        port: String,
        #[arg(long)]
        flow: String,
    },
}

pub fn run(control: &Path, cmd: RssCmd) -> anyhow::Result<()> {
    match cmd {
        RssCmd::Hash {
            key,
            input,
            flow,
            symmetric,
        } => {
            let t = toeplitz(key.as_deref())?;
            let h = match (input, flow) {
                (Some(hex), None) => t
                    .hash(&parse_hex(&hex).context("--input")?)
                    .map_err(|e| anyhow::anyhow!("--input: {e}"))?,
                (None, Some(f)) => {
                    let (k, ports) = parse_flow(&f)?;
                    if symmetric {
                        t.hash_flow_symmetric(&k, ports)
                    } else {
                        t.hash_flow(&k, ports)
                    }
                }
                _ => bail!("give --input HEX or --flow FLOW"),
            };
            println!("{h:08x}");
        }
        RssCmd::Show { port } => {
            let (queues, table) = reta(control, &port)?;
            println!("port {port}: enabled receive queues {queues:?}");
            print!("{}", Reta::new(&queues).render());
            debug_assert_eq!(Reta::new(&queues).table().to_vec(), table);
        }
        RssCmd::Queue { port, flow } => {
            let (queues, table) = reta(control, &port)?;
            if queues.is_empty() {
                bail!("port {port} has no enabled receive queue");
            }
            let (k, ports) = parse_flow(&flow)?;
            let h = Toeplitz::default().hash_flow(&k, ports);
            let q = table[(h as usize) & (table.len() - 1)];
            println!(
                "hash {h:08x} -> bucket {} -> queue {q}",
                (h as usize) & (table.len() - 1)
            );
        }
    }
    Ok(())
}

fn reta(control: &Path, port: &str) -> anyhow::Result<(Vec<u16>, Vec<u16>)> {
    match call(
        control,
        &Request::Rss {
            port: port.to_string(),
        },
    )? {
        Response::Rss { queues, table } => Ok((queues, table)),
        _ => bail!("unexpected reply"),
    }
}

fn toeplitz(key: Option<&str>) -> anyhow::Result<Toeplitz> {
    match key {
        None => Ok(Toeplitz::default()),
        Some(hex) => {
            let k = parse_hex(hex).context("--key")?;
            Toeplitz::new(&k).map_err(|e| anyhow::anyhow!("--key: {e}"))
        }
    }
}

/// Hex digits, optionally with spaces, colons or a 0x prefix.
pub fn parse_hex(s: &str) -> anyhow::Result<Vec<u8>> {
    let digits: String = s
        .trim_start_matches("0x")
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ':')
        .collect();
    if !digits.len().is_multiple_of(2) {
        bail!("odd number of hex digits");
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&digits[i..i + 2], 16).map_err(|_| anyhow::anyhow!("not hex: '{s}'"))
        })
        .collect()
}

fn endpoint(s: &str, with_port: bool) -> anyhow::Result<(IpAddr, u16)> {
    if !with_port {
        let a = s.trim_start_matches('[').trim_end_matches(']');
        return Ok((a.parse().with_context(|| format!("bad address '{s}'"))?, 0));
    }
    let (addr, port) = s
        .rsplit_once(':')
        .with_context(|| format!("'{s}' needs ADDR:PORT"))?;
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    Ok((
        addr.parse()
            .with_context(|| format!("bad address '{addr}'"))?,
        port.parse().with_context(|| format!("bad port '{port}'"))?,
    ))
}

/// Parses SRC:SPORT-DST:DPORT/tcp|udp or SRC-DST/ip into a flow key; the bool says whether
/// ports take part in the hash.
pub fn parse_flow(s: &str) -> anyhow::Result<(FlowKey, bool)> {
    let (eps, proto) = s.rsplit_once('/').context("flow needs /tcp, /udp or /ip")?;
    let (proto, with_ports) = match proto {
        "tcp" => (6u8, true),
        "udp" => (17, true),
        "ip" => (0, false),
        p => bail!("unknown protocol '{p}' (tcp, udp or ip)"),
    };
    let (src, dst) = eps.split_once('-').context("flow needs SRC-DST")?;
    let (sa, sp) = endpoint(src, with_ports)?;
    let (da, dp) = endpoint(dst, with_ports)?;
    let ips = match (sa, da) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpPair::V4 {
            src: s.octets(),
            dst: d.octets(),
        },
        (IpAddr::V6(s), IpAddr::V6(d)) => IpPair::V6 {
            src: s.octets(),
            dst: d.octets(),
        },
        _ => bail!("source and destination must both be IPv4 or both IPv6"),
    };
    Ok((
        FlowKey {
            ips,
            proto,
            ports: with_ports.then_some((sp, dp)),
        },
        with_ports,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microsoft_table_rows() {
        let t = Toeplitz::default();
        // The table lists the destination first; the flow is written source first.
        let (k, p) = parse_flow("66.9.149.187:2794-161.142.100.80:1766/tcp").unwrap();
        assert_eq!(t.hash_flow(&k, p), 0x51ccc178);
        let (k, p) = parse_flow("66.9.149.187-161.142.100.80/ip").unwrap();
        assert_eq!(t.hash_flow(&k, p), 0x323e8fc2);
        let (k, p) =
            parse_flow("[3ffe:2501:200:1fff::7]:2794-[3ffe:2501:200:3::1]:1766/tcp").unwrap();
        assert_eq!(t.hash_flow(&k, p), 0x40207d3d);
        let raw = parse_hex("420995bb a18e6450 0aea 06e6").unwrap();
        assert_eq!(t.hash(&raw), Ok(0x51ccc178));
    }

    #[test]
    fn long_keys() {
        // Microsoft's key and 12 more bytes: the first 40 are all a 12-byte input uses.
        let key = format!(
            "{}{}",
            "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa",
            "5b0ec24167253d43a38fb0d0"
        );
        let t = toeplitz(Some(&key)).unwrap();
        assert_eq!(t.key().len(), 52);
        let raw = parse_hex("420995bb a18e6450 0aea 06e6").unwrap();
        assert_eq!(t.hash(&raw), Ok(0x51ccc178));
        assert!(t.hash(&[0; 48]).is_ok());
        let e = t.hash(&[0; 49]).unwrap_err().to_string();
        assert!(e.contains("too short for 49 input bytes"), "{e}");
        let e = toeplitz(Some("00ff")).unwrap_err().to_string();
        assert!(e.contains("--key: RSS key of 2 bytes is too short"), "{e}");
    }

    #[test]
    fn bad_flows_are_clear_errors() {
        for f in [
            "1.2.3.4:1-5.6.7.8:2",
            "1.2.3.4:1-5.6.7.8:2/sctp",
            "1.2.3.4:1/tcp",
            "1.2.3.4:x-5.6.7.8:2/tcp",
            "1.2.3.4:1-[::1]:2/tcp",
        ] {
            assert!(parse_flow(f).is_err(), "{f}");
        }
        assert!(parse_hex("abc").is_err());
        assert!(parse_hex("zz").is_err());
    }
}
