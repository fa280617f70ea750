//! sFlow decoded by the operators' own tool (package tshark): datagrams written into a
//! classic pcap, read back field by field. tshark runs to completion, bounded by its input;
//! it writes its profile under `HOME`, which the tests point at their temp dir.

use std::path::Path;
use std::process::Command;

/// Writes UDP payloads (127.0.0.1:50000 → 127.0.0.1:6343, sFlow's port) into a classic
/// pcap file at `path`.
pub fn sflow_pcap(path: &Path, datagrams: &[Vec<u8>]) {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes()); // Ethernet
    for d in datagrams {
        let mut p = Vec::new();
        p.extend_from_slice(&[0; 12]);
        p.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        p.extend_from_slice(&((28 + d.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1]);
        p.extend_from_slice(&50000u16.to_be_bytes());
        p.extend_from_slice(&6343u16.to_be_bytes());
        p.extend_from_slice(&((8 + d.len()) as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(d);
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&(p.len() as u32).to_le_bytes());
        f.extend_from_slice(&(p.len() as u32).to_le_bytes());
        f.extend_from_slice(&p);
    }
    std::fs::write(path, f).unwrap();
}

/// `tshark -T fields` over the sFlow pcap `file`: one line per packet matching `filter`,
/// the fields `names` separated by `|`, repeated values of a field joined by `,`. `home` is
/// tshark's `HOME` (a temp dir of the test's).
pub fn sflow_fields(home: &Path, file: &Path, filter: &str, names: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("tshark");
    cmd.env("HOME", home)
        .args(["-n", "-r"])
        .arg(file)
        .args(["-d", "udp.port==6343,sflow", "-Y", filter, "-T", "fields"])
        .args(["-E", "separator=|", "-E", "aggregator=,"]);
    for n in names {
        cmd.args(["-e", n]);
    }
    let out = cmd.output().expect("tshark");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}
