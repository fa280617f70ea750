//! Skip or fail: the one place that decides what a test does when the machine lacks what it
//! needs (root, two CPUs, a tool, QEMU, testpmd, a browser).
//!
//! By default the test prints `skipped: REASON` and returns, so `cargo test` works on a
//! laptop. With `QSWITCH_REQUIRE_PRIVILEGED=1` (CI sets it in `.ci/run`) the test fails
//! instead: a CI machine that lost a capability must not stay green. Every skip is also
//! appended to the file named by `QSWITCH_SKIP_LOG`, if set (`tests/run.sh` counts them).

use std::io::Write;

/// The variable that turns skips into failures.
pub const REQUIRE_ENV: &str = "QSWITCH_REQUIRE_PRIVILEGED";
/// The variable naming a file every skip is appended to (one line each).
pub const SKIP_LOG_ENV: &str = "QSWITCH_SKIP_LOG";

/// True when skips must fail (`QSWITCH_REQUIRE_PRIVILEGED` set to anything but `0` or empty).
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The test cannot run here: panics when [`required`], else prints `skipped: REASON`, logs
/// the skip and returns (the caller then returns).
#[track_caller]
pub fn skip(reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    assert!(
        !required(),
        "{test}: {reason} ({REQUIRE_ENV} is set, so this fails instead of skipping)"
    );
    eprintln!("skipped: {reason}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{test}: {reason}");
        }
    }
}

/// `have`, or else [`skip`] with `reason`: `if !require(x, "needs x") { return; }`.
#[track_caller]
pub fn require(have: bool, reason: &str) -> bool {
    if !have {
        skip(reason);
    }
    have
}

/// True when the effective uid is 0 (from `/proc/self/status`, no `unsafe`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// True when root; otherwise [`skip`]s with "needs root".
#[track_caller]
pub fn root_or_skip() -> bool {
    require(is_root(), "needs root")
}

/// True when `program --version` (or `args`) runs and succeeds.
pub fn have_tool(program: &str, args: &[&str]) -> bool {
    std::process::Command::new(program)
        .args(if args.is_empty() {
            &["--version"]
        } else {
            args
        })
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The online CPUs, from `/sys/devices/system/cpu/online`.
pub fn online_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online CPUs");
    parse_cpu_ranges(text.trim())
}

/// `"0-3,5"` as `[0, 1, 2, 3, 5]` (the kernel's format; no strides).
fn parse_cpu_ranges(text: &str) -> Vec<usize> {
    let num = |s: &str| s.parse::<usize>().expect("CPU number");
    text.split(',')
        .filter(|r| !r.is_empty())
        .flat_map(|r| match r.split_once('-') {
            Some((a, b)) => num(a)..=num(b),
            None => num(r)..=num(r),
        })
        .collect()
}

/// At least `n` online CPUs; otherwise [`skip`]s.
#[track_caller]
pub fn cpus_or_skip(n: usize) -> bool {
    require(online_cpus().len() >= n, &format!("needs {n} online CPUs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_matches_the_status_file() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(status.contains("Uid:"));
        let _ = is_root();
        assert!(!online_cpus().is_empty());
        assert_eq!(parse_cpu_ranges("0-2,5"), [0, 1, 2, 5]);
    }
}
