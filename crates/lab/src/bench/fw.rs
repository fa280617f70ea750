//! The firewall's benchmarks (issue 31): the security group every one of them uses, and
//! `fw-scale`, 1 → 2 workers with the firewall on, the two directions of each connection on
//! different workers. `pvp --firewall` (qswitch-fw next to OVS-DPDK with `ct()`) and
//! `pvp --firewall --new-flows` (new connections per second) are in [`super::pvp`].
//!
//! `fw-scale` runs two gen ports, `x` and `y`, that answer each other: `x` sends N UDP flows
//! 10.9.0.1:(1024 + f) → 10.9.0.2:5001 and `y` the replies 10.9.0.2:5001 → 10.9.0.1:(1024 +
//! f) (`generate.ip`, `reply = true`), both at full speed. With the firewall on, both ports
//! are in the group of [`group`]: each frame is checked on the way out of its port (egress,
//! the group's rule 0) and on the way into the other (ingress, rule 50 of 50 ingress rules
//! for a new connection, the connection's entry after). With two workers each port has its
//! own (static placement, one queue each), so a connection's two directions are looked up
//! and updated by different workers, in both zones. With one worker it polls both. The
//! firewall off (the same ports without groups) is the reference.

use std::path::Path;

use anyhow::bail;
use qswitch_api::request::CtStatsReport;
use qswitch_api::{Request, Response};

use super::gen::{run_scenario, switch_section, two_cpus, Contender};
use super::Bench;

/// The group's name in every firewall benchmark.
pub const GROUP: &str = "bench";
/// Ingress rules before the one that matches (none of them matches the load).
pub const DECOYS: usize = 49;
/// `fw-scale`'s connections without `--flows`.
const SCALE_FLOWS: u32 = 10_000;

/// `[[security_group]]` GROUP, stateful: rule 0 lets everything out (egress), rules 1..=49
/// are ingress rules the load never matches (TCP and UDP to other ports, UDP from other
/// networks), rule 50, `last` (a TOML inline table), is the one ingress rule that does.
pub fn group(last: &str) -> String {
    let mut rules = vec![r#"{ direction = "egress" }"#.to_string()];
    for i in 0..DECOYS {
        rules.push(if i % 2 == 0 {
            format!(
                r#"{{ direction = "ingress", protocol = "tcp", ports = "{}" }}"#,
                2000 + i
            )
        } else {
            format!(
                r#"{{ direction = "ingress", protocol = "udp", ports = "{}", remote = "192.168.{i}.0/24" }}"#,
                3000 + i
            )
        });
    }
    rules.push(last.to_string());
    format!(
        "[[security_group]]\nname = \"{GROUP}\"\nrules = [\n  {},\n]\n",
        rules.join(",\n  ")
    )
}

/// `ct stats` of the daemon on `control`.
pub fn ct_stats(control: &Path) -> anyhow::Result<CtStatsReport> {
    match qswitch_api::client::call(control, &Request::CtStats)? {
        Response::CtStats(r) => Ok(*r),
        Response::Error { message } => bail!("ct stats: {message}"),
        _ => bail!("ct stats: unexpected reply"),
    }
}

/// One of `fw-scale`'s gen ports.
fn port(name: &str, (mac, peer): (&str, &str), flows: u16, ip: &str, fw: bool) -> String {
    let groups = if fw {
        format!("security_groups = [\"{GROUP}\"]\n")
    } else {
        String::new()
    };
    format!(
        "[[port]]\nname = \"{name}\"\ntype = \"gen\"\nmac = \"{mac}\"\n{groups}\
         generate = {{ dst = \"{peer}\", size = 64, rate = 0, flows = {flows}, ip = {ip} }}\n"
    )
}

pub fn scale(b: &Bench) -> anyhow::Result<()> {
    let [c0, c1] = two_cpus()?;
    let flows = u16::try_from(b.args.flows.unwrap_or(SCALE_FLOWS)).unwrap_or(u16::MAX);
    const X: &str = "02:00:00:00:00:21";
    const Y: &str = "02:00:00:00:00:22";
    let ports = move |fw: bool| {
        let mut s = port(
            "x",
            (X, Y),
            flows,
            r#"{ src = "10.9.0.1", dst = "10.9.0.2" }"#,
            fw,
        );
        s += &port(
            "y",
            (Y, X),
            flows,
            r#"{ src = "10.9.0.2", dst = "10.9.0.1", reply = true }"#,
            fw,
        );
        if fw {
            // Two entries (one per port's zone) per connection, and room to spare.
            s += &format!(
                "\n[firewall]\nmax_sessions = {}\n\n{}",
                (4 * u32::from(flows)).max(1 << 16),
                group(r#"{ direction = "ingress", protocol = "udp", remote = "10.9.0.0/16" }"#)
            );
        }
        s
    };
    let config = move |workers: String, fw: bool| -> Box<dyn Fn(&Path) -> String> {
        Box::new(move |c| format!("{}{}", switch_section(&workers, c), ports(fw)))
    };
    let (one, two) = (c0.to_string(), format!("{c0},{c1}"));
    let contenders = vec![
        Contender {
            name: "fw 1 worker",
            config: config(one.clone(), true),
        },
        Contender {
            name: "fw 2 workers",
            config: config(two.clone(), true),
        },
        Contender {
            name: "off 1 worker",
            config: config(one, false),
        },
        Contender {
            name: "off 2 workers",
            config: config(two, false),
        },
    ];
    let about = format!(
        "gen ports x <-> y, {flows} UDP connections (x sends them, y the replies; 64 B, full \
         speed), firewall on (both ports in a stateful group of 50 ingress rules, the last \
         matching) and off; 1 worker on CPU {c0}, then 2 workers on CPUs {c0},{c1} (one port \
         each: a connection's two directions on different workers)"
    );
    run_scenario(
        b,
        "fw-scale",
        &about,
        &contenders,
        &["x", "y"],
        [c0, c1],
        Some(1.8),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_parses_and_has_fifty_ingress_rules() {
        let toml = format!(
            "[switch]\nworkers = \"0\"\n\n[[port]]\nname = \"a\"\ntype = \"gen\"\n\
             security_groups = [\"{GROUP}\"]\n\n{}",
            group(r#"{ direction = "ingress", protocol = "udp", ports = "9" }"#)
        );
        let c = qswitch_api::Config::from_toml(&toml).expect("config");
        let g = &c.security_groups[0];
        assert_eq!(g.rules.len(), 51);
        let ingress =
            (g.rules.iter()).filter(|r| r.direction == qswitch_api::config::RuleDirection::Ingress);
        assert_eq!(ingress.count(), 50);
    }
}
