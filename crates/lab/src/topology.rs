//! The two-TAP switch that `qswitch demo` and the TAP benchmarks start: the embedded config
//! and the CPUs its workers get.

use anyhow::Context;

/// The embedded default config (two TAP ports; placeholders in braces).
pub const DEFAULT_CONFIG: &str = include_str!("demo.toml");

/// Fills in the default config's placeholders.
pub fn config(workers: &str, control: &str, tap_a: &str, tap_b: &str) -> String {
    DEFAULT_CONFIG
        .replace("{workers}", workers)
        .replace("{control}", control)
        .replace("{tap_a}", tap_a)
        .replace("{tap_b}", tap_b)
}

/// [`config`] with `queues` queues on each TAP port (1: the default, left out).
pub fn config_queues(
    workers: &str,
    control: &str,
    tap_a: &str,
    tap_b: &str,
    queues: u16,
) -> String {
    let text = config(workers, control, tap_a, tap_b);
    if queues == 1 {
        return text;
    }
    text.replace(
        "type = \"tap\"\n",
        &format!("type = \"tap\"\nqueues = {queues}\n"),
    )
}

/// The online CPUs as a CPU list (at most `max` of them).
pub fn worker_cpus(max: usize) -> anyhow::Result<String> {
    let cpus = qswitch_sys::thread::online_cpus()?;
    let list =
        qswitch_api::CpuList::from_cpus(cpus.into_iter().take(max)).context("no online CPUs")?;
    Ok(list.to_string())
}

/// Removes a directory (and everything in it) on drop.
pub struct RemoveDir(pub std::path::PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
