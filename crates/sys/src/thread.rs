//! Thread spawning, CPU affinity, CPU lists, thread ids and per-thread / per-process CPU
//! accounting.

use std::io;
use std::mem::MaybeUninit;

use crate::cvt;

const WORD_BITS: usize = libc::c_ulong::BITS as usize;

/// Pins the calling thread to `cpu` (`sched_setaffinity(0, ...)`). `EINVAL` if `cpu` is
/// offline, absent, or outside this process's cpuset.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    set_current_thread_cpus(&[cpu])
}

/// Lets the calling thread (and the threads it creates from now on) run on `cpus` only.
/// `EINVAL` if none of them is online and inside this process's cpuset, or `cpus` is empty.
pub fn set_current_thread_cpus(cpus: &[usize]) -> io::Result<()> {
    // The kernel takes a bitmap of unsigned longs of any length; make it at least as long
    // as a `cpu_set_t` and long enough to hold every CPU.
    let top = cpus.iter().copied().max().unwrap_or(0);
    let words = (top / WORD_BITS + 1).max(libc::CPU_SETSIZE as usize / WORD_BITS);
    let mut mask: Vec<libc::c_ulong> = vec![0; words];
    for &cpu in cpus {
        mask[cpu / WORD_BITS] |= 1 << (cpu % WORD_BITS);
    }
    // SAFETY: the kernel reads `size_of_val(&mask)` bytes from the pointer, exactly the
    // live `mask` buffer; the `cpu_set_t` pointer type is only nominal (it is a bitmap
    // of unsigned longs too).
    cvt(unsafe {
        libc::sched_setaffinity(
            0,
            std::mem::size_of_val(mask.as_slice()),
            mask.as_ptr().cast::<libc::cpu_set_t>(),
        )
    })?;
    Ok(())
}

/// Spawns every long-lived thread of the program: named `name` (the kernel keeps the first
/// 15 bytes), confined to `cpus` before `f` runs (empty: left where the caller may run), and
/// with panics caught. `f` gets the outcome of the confinement: a thread that could not be
/// confined still runs, and `f` decides whether that matters. If `f` panics, `on_panic` runs
/// on the dying thread with a message that names it and quotes the panic, e.g.
/// `thread 'qs-worker-0' panicked: index out of bounds`; the thread then ends normally, so
/// joining it does not propagate the panic.
pub fn spawn<F, P>(
    name: String,
    cpus: &[usize],
    on_panic: P,
    f: F,
) -> io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce(io::Result<()>) + Send + 'static,
    P: FnOnce(String) + Send + 'static,
{
    let cpus = cpus.to_vec();
    let thread_name = name.clone();
    std::thread::Builder::new().name(name).spawn(move || {
        let confined = if cpus.is_empty() {
            Ok(())
        } else {
            set_current_thread_cpus(&cpus)
        };
        let run = std::panic::AssertUnwindSafe(move || f(confined));
        if let Err(payload) = std::panic::catch_unwind(run) {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_string());
            on_panic(format!("thread '{thread_name}' panicked: {what}"));
        }
    })
}

/// The calling thread's kernel thread id.
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // Thread ids are `pid_t` (i32), so this never truncates.
    tid as i32
}

/// CPUs present and online, ascending, from `/sys/devices/system/cpu/online` (format
/// `"0-3,5,7-8"`); falls back to the calling thread's affinity mask
/// (`sched_getaffinity`) if that file cannot be read or parsed.
pub fn online_cpus() -> io::Result<Vec<usize>> {
    match std::fs::read_to_string("/sys/devices/system/cpu/online")
        .and_then(|text| parse_cpu_list(&text))
    {
        Ok(cpus) => Ok(cpus),
        Err(_) => affinity_cpus(),
    }
}

/// Parses a kernel CPU list such as `"0-3,5,7-8\n"` into ascending CPU numbers.
/// Empty or malformed lists are `InvalidData`.
fn parse_cpu_list(text: &str) -> io::Result<Vec<usize>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad CPU list {text:?}"));
    let num = |s: &str| s.parse::<usize>().map_err(|_| bad());
    let text = text.trim();
    if text.is_empty() {
        return Err(bad());
    }
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (num(lo)?, num(hi)?),
            None => (num(part)?, num(part)?),
        };
        if lo > hi {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The CPUs in the calling thread's affinity mask (`sched_getaffinity(0, ...)`).
fn affinity_cpus() -> io::Result<Vec<usize>> {
    // Start with a `cpu_set_t`'s worth and grow while the kernel says it is too small
    // (EINVAL) for its number of CPU ids.
    let mut words = libc::CPU_SETSIZE as usize / WORD_BITS;
    loop {
        let mut mask: Vec<libc::c_ulong> = vec![0; words];
        // SAFETY: the kernel writes at most `size_of_val(&mask)` bytes through the
        // pointer, exactly the live, exclusively borrowed `mask` buffer; the `cpu_set_t`
        // pointer type is only nominal (it is a bitmap of unsigned longs too).
        let ret = unsafe {
            libc::sched_getaffinity(
                0,
                std::mem::size_of_val(mask.as_slice()),
                mask.as_mut_ptr().cast::<libc::cpu_set_t>(),
            )
        };
        match cvt(ret) {
            Ok(_) => {
                let cpus = (0..words * WORD_BITS)
                    .filter(|&cpu| mask[cpu / WORD_BITS] & (1 << (cpu % WORD_BITS)) != 0)
                    .collect();
                return Ok(cpus);
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && words < 1 << 16 => words *= 2,
            Err(e) => return Err(e),
        }
    }
}

fn task_file(tid: i32, file: &str) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/{file}"))
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// `(voluntary, nonvoluntary)` context switches of thread `tid` of this process, from
/// `/proc/self/task/<tid>/status`. `NotFound` if there is no such thread.
pub fn ctx_switches(tid: i32) -> io::Result<(u64, u64)> {
    parse_ctx_switches(&task_file(tid, "status")?)
}

fn parse_ctx_switches(status: &str) -> io::Result<(u64, u64)> {
    let field = |key: &str| -> io::Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| invalid(format!("no {key} in task status")))
    };
    Ok((
        field("voluntary_ctxt_switches")?,
        field("nonvoluntary_ctxt_switches")?,
    ))
}

/// Total CPU time (user + system) of thread `tid` of this process in nanoseconds, from
/// `/proc/self/task/<tid>/stat`. Resolution is one clock tick (`sysconf(_SC_CLK_TCK)`,
/// usually 10 ms). `NotFound` if there is no such thread.
pub fn thread_cpu_ns(tid: i32) -> io::Result<u64> {
    let ticks = parse_stat_ticks(&task_file(tid, "stat")?)?;
    Ok(ticks_to_ns(ticks, clock_ticks_per_sec()))
}

/// `utime + stime` (fields 14 and 15) of a `/proc/.../stat` line. The command name
/// (field 2) may contain spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat_ticks(stat: &str) -> io::Result<u64> {
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| invalid("task stat has no command name".into()))?;
    // `rest` starts at field 3 (state), so utime is its 12th field.
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let mut next = || -> io::Result<u64> {
        fields
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| invalid("task stat too short".into()))
    };
    Ok(next()? + next()?)
}

fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf() has no memory-safety preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(tck).ok().filter(|&t| t > 0).unwrap_or(100)
}

fn ticks_to_ns(ticks: u64, per_sec: u64) -> u64 {
    let ns = u128::from(ticks) * 1_000_000_000 / u128::from(per_sec);
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// Total CPU time (user + system) of the whole process in nanoseconds
/// (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`).
pub fn process_cpu_ns() -> u64 {
    let mut ts = MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: clock_gettime writes one `timespec` through the pointer, which points to
    // the live local `ts`.
    let ret = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, ts.as_mut_ptr()) };
    if ret != 0 {
        // Cannot happen for this clock on Linux.
        return 0;
    }
    // SAFETY: clock_gettime returned 0, so it initialised `ts`.
    let ts = unsafe { ts.assume_init() };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Involuntary context switches of the calling thread so far (`getrusage(RUSAGE_THREAD)`):
/// how often something else took its CPU.
pub fn own_involuntary_ctx_switches() -> u64 {
    // SAFETY: rusage is plain data; zeroed is a valid value for it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage for the kernel to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0;
    }
    ru.ru_nivcsw as u64
}

/// Sets the process's file mode creation mask and returns the previous one.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask() has no preconditions, cannot fail and touches no memory.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// The effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid() has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether the effective user id is 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid() has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The id of the group called `name` (through NSS, like `chgrp`); a number is taken as
/// the id itself. `NotFound` if there is no such group.
pub fn group_id(name: &str) -> std::io::Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let cname = std::ffi::CString::new(name)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in group name"))?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: all-zero bytes are a valid `group` (null pointers, zero id).
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: `cname` is NUL-terminated; `grp`, `buf` (with its true length) and
        // `result` are valid and writable for the call; the strings it leaves in `buf` are
        // not used after it returns, only the id.
        let rc = unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast::<libc::c_char>(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        if result.is_null() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no group named {name}"),
            ));
        }
        return Ok(grp.gr_gid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn spawn_names_confines_and_reports_a_panic() {
        let cpu = online_cpus().unwrap()[0];
        let (tx, rx) = std::sync::mpsc::channel();
        let t = spawn(
            "qs-test-ok".into(),
            &[cpu],
            |_| unreachable!("no panic here"),
            move |confined| {
                let name = std::thread::current().name().map(String::from);
                tx.send((confined.is_ok(), name)).unwrap();
            },
        )
        .unwrap();
        t.join().unwrap();
        let (_, name) = rx.recv().unwrap();
        assert_eq!(name.as_deref(), Some("qs-test-ok"));

        let (tx, rx) = std::sync::mpsc::channel();
        let t = spawn(
            "qs-test-boom".into(),
            &[],
            move |why| tx.send(why).unwrap(),
            |_| panic!("boom {}", 42),
        )
        .unwrap();
        t.join().expect("the panic is caught");
        assert_eq!(
            rx.recv().unwrap(),
            "thread 'qs-test-boom' panicked: boom 42"
        );
    }

    #[test]
    fn cpu_list_parser() {
        assert_eq!(parse_cpu_list("0-3,5,7-8").unwrap(), [0, 1, 2, 3, 5, 7, 8]);
        assert_eq!(parse_cpu_list("0\n").unwrap(), [0]);
        assert_eq!(parse_cpu_list("2,0-1").unwrap(), [0, 1, 2]);
        for bad in ["", "\n", "a", "1-", "-1", "3-1", "0,,1", "0-1-2", "1 ,2"] {
            let err = parse_cpu_list(bad).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
    }

    #[test]
    fn online_cpus_nonempty_and_within_affinity_range() {
        let cpus = online_cpus().unwrap();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
        assert!(!affinity_cpus().unwrap().is_empty());
    }

    #[test]
    fn pin_to_first_online_cpu() {
        // Runs on its own test thread, so pinning does not leak into other tests.
        let first = online_cpus().unwrap()[0];
        pin_current_thread(first).unwrap();
        assert_eq!(affinity_cpus().unwrap(), [first]);
        let status = task_file(gettid(), "status").unwrap();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap();
        assert_eq!(parse_cpu_list(allowed).unwrap(), [first]);

        let err = pin_current_thread(100_000).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn gettid_is_per_thread() {
        let main = gettid();
        assert!(main > 0);
        let other = std::thread::spawn(gettid).join().unwrap();
        assert_ne!(main, other);
        assert_eq!(gettid(), main);
    }

    #[test]
    fn ctx_switches_of_current_thread() {
        let tid = gettid();
        let (v0, _) = ctx_switches(tid).unwrap();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (v1, _) = ctx_switches(tid).unwrap();
        assert!(v1 >= v0 + 3, "{v0} -> {v1}");
        assert_eq!(
            ctx_switches(-1).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn cpu_time_of_current_thread_and_process() {
        let tid = gettid();
        let t0 = thread_cpu_ns(tid).unwrap();
        let p0 = process_cpu_ns();
        // Spin until the thread has been charged at least one clock tick (bounded).
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut x = 0u64;
        let mut t1 = t0;
        while t1 == t0 && Instant::now() < deadline {
            let chunk = Instant::now();
            while chunk.elapsed() < Duration::from_millis(20) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            t1 = thread_cpu_ns(tid).unwrap();
        }
        let p1 = process_cpu_ns();
        assert!(t1 > t0, "thread cpu {t0} -> {t1}");
        assert!(p1 > p0, "process cpu {p0} -> {p1}");
        assert!(thread_cpu_ns(-1).is_err());
    }

    #[test]
    fn stat_and_status_parsers() {
        let stat = "123 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15";
        // utime = 11, stime = 12 (fields 14, 15).
        assert_eq!(parse_stat_ticks(stat).unwrap(), 23);
        assert!(parse_stat_ticks("123 (x) S 1 2").is_err());
        assert_eq!(ticks_to_ns(3, 100), 30_000_000);

        let status = "Name:\tx\nvoluntary_ctxt_switches:\t7\nnonvoluntary_ctxt_switches:\t2\n";
        assert_eq!(parse_ctx_switches(status).unwrap(), (7, 2));
        assert!(parse_ctx_switches("Name:\tx\n").is_err());
    }

    #[test]
    fn root_matches_proc_status() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        let euid = uid_line.split_ascii_whitespace().nth(2).unwrap();
        assert_eq!(is_root(), euid == "0");
    }
}
