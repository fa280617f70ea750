#!/usr/bin/env python3
"""System calls per frame on both sides of `qswitch bench pvp` under the DPDK load.

For each contender (qswitch, ovs-dpdk, testpmd-io) it runs `qswitch bench pvp --only C --runs 1`
and, while each frame size's traffic flows, counts with `perf stat` (kernel tracepoints, no
PMU needed, little overhead) the system calls of every thread of the load (qsload) and of the
switch for a few seconds: all of them, `write` (an eventfd kick or call is a write),
`epoll_wait`/`epoll_pwait` (a worker going to sleep), `read`. The frames moved in that
window come from the bench's Mpps for the run. A polling pair (notifications off both ways)
makes none per frame; a back-end that asks for kicks before it sleeps makes its load pay a
write per kick.

Usage: bench/pvp-syscalls.py [QSWITCH_BINARY] (default target/release/qswitch; root)
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

QSWITCH = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/qswitch")
CONTENDERS = os.environ.get("CONTENDERS", "qswitch ovs-dpdk testpmd-io").split()
# The switch processes the bench starts (pgrep -f patterns).
SWITCH = {"qswitch": "qswitch run --config /tmp/qswitch-bench-pvp-",
          "ovs-dpdk": "ovs-vswitchd-dpdk .*qswitch-bench-pvp-",
          "testpmd-io": "dpdk-testpmd .*qswitch-bench-pvp-"}
EVENTS = ["raw_syscalls:sys_enter", "syscalls:sys_enter_write", "syscalls:sys_enter_read",
          "syscalls:sys_enter_epoll_wait", "syscalls:sys_enter_epoll_pwait"]
SECONDS = 10  # traffic per frame size; qsload warms up 2 s first
WINDOW = 4  # counted seconds, from 3 s into each qsload run


def pids(pattern):
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def count(pid_list, seconds):
    """perf stat --per-thread over `pid_list` for `seconds`: {(comm, event): count}."""
    r = subprocess.run(["perf", "stat", "-x", ";", "--per-thread", "-e", ",".join(EVENTS),
                        "-p", ",".join(map(str, pid_list)), "--", "sleep", str(seconds)],
                       capture_output=True, text=True)
    got = {}
    for line in r.stderr.splitlines():
        f = line.split(";")
        if len(f) < 4 or not f[1].strip().isdigit():
            continue
        comm = re.sub(r"-\d+$", "", f[0].strip())
        got[(comm, f[3])] = got.get((comm, f[3]), 0) + int(f[1])
    return got


def main():
    rows = []
    for c in CONTENDERS:
        out = tempfile.mkdtemp(prefix="qswitch-pvp-syscalls-")
        bench = subprocess.Popen([QSWITCH, "bench", "pvp", "--only", c, "--runs", "1",
                                  "--seconds", str(SECONDS), "--out", out],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        counts, seen = [], set()
        deadline = time.time() + 240
        while bench.poll() is None and len(counts) < 2 and time.time() < deadline:
            loads = [p for p in pids(r"qswitch-bench-qsload-.*/qsload .*--size") if p not in seen]
            if not loads:
                time.sleep(0.2)
                continue
            seen.update(loads)
            time.sleep(3)
            sw = pids(SWITCH[c])
            counts.append(count(loads + sw, WINDOW))
        log = bench.communicate()[0]
        results = {}
        for m in re.finditer(r"^RESULT pvp (\S+) size=(\d+) mpps=([\d.]+)", log, re.M):
            if m.group(1) == c:
                results[int(m.group(2))] = float(m.group(3))
        for size, got in zip((64, 1518), counts):
            frames = results.get(size, 0) * 1e6 * WINDOW
            rows.append((c, size, results.get(size, 0), got, frames))
    print(f"{'contender':<11} {'size':>5} {'Mpps':>6}  thread: syscalls per 1000 frames "
          "(all / write / read / epoll_wait)")
    for c, size, mpps, got, frames in rows:
        comms = sorted({k[0] for k in got})
        parts = []
        for comm in comms:
            per = lambda e: 1000 * got.get((comm, e), 0) / frames if frames else float("nan")
            ep = per("syscalls:sys_enter_epoll_wait") + per("syscalls:sys_enter_epoll_pwait")
            if per("raw_syscalls:sys_enter") < 0.001:
                continue
            parts.append(f"{comm}: {per('raw_syscalls:sys_enter'):.3f} / "
                         f"{per('syscalls:sys_enter_write'):.3f} / "
                         f"{per('syscalls:sys_enter_read'):.3f} / {ep:.3f}")
        print(f"{c:<11} {size:>5} {mpps:>6.2f}  " + ("; ".join(parts) or "none"))
    print(json.dumps([{"contender": c, "size": s, "mpps": m, "frames": f,
                       "counts": {f"{k[0]} {k[1]}": v for k, v in g.items()}}
                      for c, s, m, g, f in rows]))


if __name__ == "__main__":
    main()
