//! Machine-wide counters from `/proc/stat`: CPU jiffies (total and idle) and context switches.
//! The one parser of that file; the benchmarks and the demo read it through [`read`].

/// One reading of `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineStat {
    /// All CPUs: user + nice + system + idle + iowait + irq + softirq + steal jiffies.
    pub total: u64,
    /// All CPUs: idle + iowait jiffies.
    pub idle: u64,
    /// Context switches since boot (`ctxt`).
    pub ctxt: u64,
}

impl MachineStat {
    /// `(total, idle)` jiffies, the pair [`busy_cpus`] takes.
    pub fn jiffies(&self) -> (u64, u64) {
        (self.total, self.idle)
    }
}

/// Parses the text of `/proc/stat`; missing lines read as 0.
pub fn parse(text: &str) -> MachineStat {
    let mut stat = MachineStat::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("cpu ") {
            let v: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            stat.total = v.iter().take(8).sum();
            stat.idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
        } else if let Some(rest) = line.strip_prefix("ctxt ") {
            stat.ctxt = rest.trim().parse().unwrap_or(0);
        }
    }
    stat
}

/// Reads `/proc/stat` now (all zero if it cannot be read).
pub fn read() -> MachineStat {
    parse(&std::fs::read_to_string("/proc/stat").unwrap_or_default())
}

/// Total and idle CPU jiffies of the machine.
pub fn cpu_jiffies() -> (u64, u64) {
    read().jiffies()
}

/// Context switches of the whole machine since boot.
pub fn machine_ctxt() -> u64 {
    read().ctxt
}

/// Busy CPUs (0.0..=cores) between two [`cpu_jiffies`] readings.
pub fn busy_cpus(before: (u64, u64), after: (u64, u64)) -> f64 {
    let total = after.0.saturating_sub(before.0) as f64;
    let idle = after.1.saturating_sub(before.1) as f64;
    if total == 0.0 {
        return 0.0;
    }
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    (total - idle) / total * cores
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_ctxt() {
        let text = "cpu  10 1 5 100 4 0 2 0 0 0\ncpu0 5 0 2 50 2 0 1 0 0 0\nintr 1 2\nctxt 12345\nbtime 1\n";
        let s = parse(text);
        assert_eq!(s.total, 10 + 1 + 5 + 100 + 4 + 2);
        assert_eq!(s.idle, 104);
        assert_eq!(s.ctxt, 12345);
        assert_eq!(parse(""), MachineStat::default());
    }

    #[test]
    fn reads_this_machine() {
        let s = read();
        assert!(s.total > s.idle && s.ctxt > 0, "{s:?}");
    }

    #[test]
    fn busy_is_the_non_idle_share_times_cores() {
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        assert_eq!(busy_cpus((0, 0), (100, 50)), 0.5 * cores);
        assert_eq!(busy_cpus((5, 5), (5, 5)), 0.0);
    }
}
