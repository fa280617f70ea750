//! `qswitch rss hash` reproduces Microsoft's RSS verification table (protocols.md 1.1), both
//! from raw input bytes and from flows written source first.

use std::process::Command;

fn hash(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_qswitch"))
        .args(["rss", "hash"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// (source, source port, destination, destination port, IP only, with TCP): the table lists
/// destination first; the hash input is source first.
const V4: &[(&str, u16, &str, u16, &str, &str)] = &[
    (
        "66.9.149.187",
        2794,
        "161.142.100.80",
        1766,
        "323e8fc2",
        "51ccc178",
    ),
    (
        "199.92.111.2",
        14230,
        "65.69.140.83",
        4739,
        "d718262a",
        "c626b0ea",
    ),
    (
        "24.19.198.95",
        12898,
        "12.22.207.184",
        38024,
        "d2d0a5de",
        "5c2b394a",
    ),
    (
        "38.27.205.30",
        48228,
        "209.142.163.6",
        2217,
        "82989176",
        "afc7327f",
    ),
    (
        "153.39.163.191",
        44251,
        "202.188.127.2",
        1303,
        "5d1809c5",
        "10e828a2",
    ),
];
const V6: &[(&str, u16, &str, u16, &str, &str)] = &[
    (
        "3ffe:2501:200:1fff::7",
        2794,
        "3ffe:2501:200:3::1",
        1766,
        "2cc18cd5",
        "40207d3d",
    ),
    (
        "3ffe:501:8::260:97ff:fe40:efab",
        14230,
        "ff02::1",
        4739,
        "0f0c461c",
        "dde51bbf",
    ),
    (
        "3ffe:1900:4545:3:200:f8ff:fe21:67cf",
        44251,
        "fe80::200:f8ff:fe21:67cf",
        38024,
        "4b61e985",
        "02d1feef",
    ),
];

#[test]
fn flows_reproduce_the_table() {
    for &(s, sp, d, dp, ip, tcp) in V4 {
        assert_eq!(hash(&["--flow", &format!("{s}:{sp}-{d}:{dp}/tcp")]), tcp);
        assert_eq!(hash(&["--flow", &format!("{s}-{d}/ip")]), ip);
    }
    for &(s, sp, d, dp, ip, tcp) in V6 {
        assert_eq!(
            hash(&["--flow", &format!("[{s}]:{sp}-[{d}]:{dp}/tcp")]),
            tcp
        );
        assert_eq!(hash(&["--flow", &format!("[{s}]-[{d}]/ip")]), ip);
    }
}

#[test]
fn raw_input_with_explicit_key() {
    let key = "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa";
    for &(s, sp, d, dp, _, tcp) in V4 {
        let mut input = String::new();
        for a in [s, d] {
            for o in a.split('.') {
                input.push_str(&format!("{:02x}", o.parse::<u8>().unwrap()));
            }
        }
        input.push_str(&format!("{sp:04x}{dp:04x}"));
        assert_eq!(hash(&["--key", key, "--input", &input]), tcp);
    }
}

#[test]
fn bad_arguments_fail_clearly() {
    for args in [
        &["--key", "00", "--input", "00"][..],
        &["--input", "xyz"],
        &["--flow", "1.2.3.4:1-5.6.7.8:2/sctp"],
        &[],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_qswitch"))
            .args(["rss", "hash"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("qswitch: ") && !err.contains("panicked"),
            "{err}"
        );
    }
}
