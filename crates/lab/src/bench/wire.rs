//! What the scenarios with a stand-in NIC share (`uplink`, `bond`): the veth pair standing in
//! for a NIC and its cable, and the end of the report on stdout.

use super::{median, print_table, warn_if_busy, ContenderSummary, IperfRun, Ratio};
use crate::netns::{self, Link, Netns};

/// A veth pair standing in for a NIC and its cable: `w` moved into the wire peer's namespace
/// `peer` with its checksum and segmentation offloads off ([`offloads_off`]), `up` in the root
/// namespace up, with GRO off (the afxdp port docs say why) and no address. `w` stays down
/// for the caller to address or enslave.
pub(super) fn wire(peer: &Netns, up: &str, w: &str) -> anyhow::Result<Link> {
    let link = Link::veth(up, w)?;
    netns::run(&["ip", "link", "set", w, "netns", &peer.name])?;
    offloads_off(peer, w)?;
    netns::run(&["ethtool", "-K", up, "gro", "off"])?;
    netns::run(&["ip", "link", "set", up, "up"])?;
    Ok(link)
}

/// Checksum and segmentation offloads off on `ifname` in `peer`: the switch sees wire-size
/// frames, as from a NIC (a veth would otherwise hand it 64 KB super-frames).
pub(super) fn offloads_off(peer: &Netns, ifname: &str) -> anyhow::Result<()> {
    peer.exec(&[
        "ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off",
    ])?;
    Ok(())
}

/// Prints the table of the contenders that ran (`--only` leaves the others without runs;
/// none: no table) and returns them.
pub(super) fn print_ran(
    scenario: &str,
    title: &str,
    summary: &[ContenderSummary],
    ratios: &[Ratio],
) -> Vec<ContenderSummary> {
    let ran: Vec<ContenderSummary> = summary.iter().filter(|s| s.runs > 0).cloned().collect();
    if !ran.is_empty() {
        print_table(scenario, title, &ran, ratios);
    }
    ran
}

/// Prints `RESULT SCENARIO idle_busy_cpus_median=` of `idle` (the machine's busy CPUs before
/// each run's traffic), then the warning about the iperf3 `runs` that began on a busy machine.
pub(super) fn print_idle(scenario: &str, idle: &[f64], runs: &[IperfRun]) {
    println!(
        "RESULT {scenario} idle_busy_cpus_median={:.3}",
        median(idle)
    );
    warn_if_busy(runs);
}
